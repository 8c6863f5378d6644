#pragma once
// The gloo types the backend's headers name, declared without gloo's own headers, so that only
// the backend's sources compile those.
namespace gloo {
class Context;
namespace rendezvous {
class Context;
}
namespace transport {
class Buffer;
class Device;
class UnboundBuffer;
}  // namespace transport
}  // namespace gloo
