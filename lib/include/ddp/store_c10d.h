#pragma once
// Bridge to libtorch's c10d store types, for code that talks to c10d directly (a
// ProcessGroupGloo reference, the launcher's agent store). Kept apart from store.h so that
// ordinary users do not pull c10d headers in.
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "ddp/store.h"

namespace ddp {

// The c10d store behind `store`, with the store's prefix applied (a c10d::PrefixStore if any).
c10::intrusive_ptr<c10d::Store> to_c10d(const Store& store);

}  // namespace ddp
