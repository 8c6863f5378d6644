#include "comm/gloo/gloo_device.h"

#include <gloo/transport/tcp/device.h>

#include "ddp/error.h"
#include "ddp/log.h"
#include "ddp/net/local_address.h"
#include "ddp/settings.h"

namespace ddp::detail {

std::shared_ptr<gloo::transport::Device> make_gloo_device(const std::string& master_host,
                                                          const CommOptions& options) {
  gloo::transport::tcp::attr attr;
  const auto iface =
      options.socket_ifname ? options.socket_ifname : settings::text(settings::kSocketIfname);
  std::string chosen;
  if (iface) {
    attr.iface = *iface;
    chosen = "interface " + *iface;
  } else {
    attr.hostname = net::local_address_towards(master_host);
    chosen = "address " + attr.hostname + " (routes to " + master_host + ")";
  }
  try {
    auto device = gloo::transport::tcp::CreateDevice(attr);
    log::debug("gloo: listening on {}", chosen);
    return device;
  } catch (const std::exception& e) {
    throw ConfigError("gloo cannot listen on " + chosen + ": " + e.what() +
                      "; set DDP_SOCKET_IFNAME to an interface that exists (see `ip addr`)");
  }
}

}  // namespace ddp::detail
