#include "comm/fabric/provider_selection.h"

namespace ddp::detail::fabric {

ProviderChoice choose_provider(const std::optional<std::string>& ddp_provider,
                               const std::optional<std::string>& fi_provider, bool efa_available,
                               int hosts, int ranks, const std::string& shm_blocker) {
  if (ddp_provider) return {*ddp_provider, "set by DDP_FABRIC_PROVIDER"};
  if (fi_provider && fi_provider->find_first_of(",^") == std::string::npos) {
    return {*fi_provider, "set by FI_PROVIDER"};
  }
  // Ranks of one host (a single-node job, or the ranks of one node in a hierarchical job) copy
  // through shared memory even where an EFA device is present: EFA is for the network between
  // nodes.
  if (hosts == 1 && shm_blocker.empty()) {
    return {"shm", "all " + std::to_string(ranks) + " ranks share this host"};
  }
  if (efa_available) return {"efa", "an EFA device is present"};
  if (hosts == 1) return {"tcp;ofi_rxm", "all ranks share this host but " + shm_blocker};
  return {"tcp;ofi_rxm", "the " + std::to_string(ranks) + " ranks span " + std::to_string(hosts) +
                             " hosts and no EFA device is present"};
}

bool binds_to_ip_address(const std::string& provider) {
  return provider.rfind("tcp", 0) == 0 || provider.rfind("sockets", 0) == 0 ||
         provider.rfind("udp", 0) == 0 || provider.rfind("net", 0) == 0;
}

}  // namespace ddp::detail::fabric
