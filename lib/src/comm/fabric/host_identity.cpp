#include "comm/fabric/host_identity.h"

#include <unistd.h>

#include <set>
#include <sstream>

#include "comm/fabric/cross_memory_attach.h"
#include "ddp/comm/topology.h"
#include "ddp/error.h"
#include "ddp/net/local_address.h"

namespace ddp::detail::fabric {

HostIdentity HostIdentity::current(const std::string& store_host) {
  HostIdentity id;
  id.host_key = ddp::detail::node_key();
  id.pid = ::getpid();
  id.cma_probe = cma_probe_address();
  try {
    id.route_address = net::local_address_towards(store_host);
  } catch (const ConfigError&) {
    id.route_address.clear();  // only needed by socket providers, which report it then
  }
  return id;
}

std::string HostIdentity::serialize() const {
  return host_key + "\n" + std::to_string(pid) + "\n" + route_address + "\n" +
         std::to_string(cma_probe);
}

HostIdentity HostIdentity::parse(const std::string& text) {
  std::istringstream in(text);
  HostIdentity id;
  std::string pid;
  if (!std::getline(in, id.host_key) || !std::getline(in, pid)) {
    throw ConfigError("malformed host record in the rendezvous store: '" + text +
                      "'; are two jobs sharing one store prefix?");
  }
  std::getline(in, id.route_address);
  std::string probe;
  std::getline(in, probe);
  try {
    id.pid = static_cast<pid_t>(std::stol(pid));
    if (!probe.empty()) id.cma_probe = std::stoull(probe);
  } catch (const std::exception&) {
    throw ConfigError("malformed pid '" + pid + "' or probe address '" + probe +
                      "' in a host record of the rendezvous store");
  }
  return id;
}

int count_hosts(const std::vector<HostIdentity>& ranks) {
  std::set<std::string> keys;
  for (const auto& r : ranks) keys.insert(r.host_key);
  return static_cast<int>(keys.size());
}

int local_index(const std::vector<HostIdentity>& ranks, int rank) {
  int index = 0;
  for (int r = 0; r < rank; ++r) {
    if (ranks[r].host_key == ranks[rank].host_key) ++index;
  }
  return index;
}

}  // namespace ddp::detail::fabric
