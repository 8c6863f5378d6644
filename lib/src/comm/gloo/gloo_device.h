#pragma once
// Chooses the network interface gloo listens on and creates its TCP device.
#include <memory>
#include <string>

#include "comm/gloo/gloo_fwd.h"
#include "ddp/comm/communicator.h"

namespace ddp::detail {

// options.socket_ifname, DDP_SOCKET_IFNAME or GLOO_SOCKET_IFNAME name the interface; otherwise the
// local address that routes to `master_host` (never a 127.0.1.1 hostname mapping on multi-node
// jobs).
std::shared_ptr<gloo::transport::Device> make_gloo_device(const std::string& master_host,
                                                          const CommOptions& options);

}  // namespace ddp::detail
