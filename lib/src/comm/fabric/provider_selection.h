#pragma once
// Which libfabric provider a job uses. An explicit choice wins (DDP_FABRIC_PROVIDER, then
// FI_PROVIDER when it names one provider); otherwise shm when every rank is on one host, /dev/shm
// has room for their regions and the ranks can read each other's memory (cross-memory attach),
// else efa where the host has an EFA device, else tcp;ofi_rxm (RDM over TCP sockets).
#include <optional>
#include <string>

namespace ddp::detail::fabric {

struct ProviderChoice {
  std::string provider;  // as fi_getinfo's prov_name hint, e.g. "shm" or "tcp;ofi_rxm"
  std::string reason;    // for the log line
};

// Pure decision, unit-tested. `fi_provider` lists ("a,b") and exclusions ("^a") are filters for
// libfabric itself, not a choice, and are ignored here.
// `shm_blocker` says why shm cannot run here (empty when it can): its regions would not fit in
// /dev/shm, or the ranks cannot use cross-memory attach.
ProviderChoice choose_provider(const std::optional<std::string>& ddp_provider,
                               const std::optional<std::string>& fi_provider, bool efa_available,
                               int hosts, int ranks, const std::string& shm_blocker = "");

// choose_provider with DDP_FABRIC_PROVIDER and FI_PROVIDER from the environment; `efa_probe`
// runs only when nothing was chosen explicitly.
template <typename EfaProbe>
ProviderChoice choose_provider_from_env(EfaProbe&& efa_probe, int hosts, int ranks,
                                        const std::string& shm_blocker);

// Whether a name is a socket-based provider that binds to an IP address (tcp, sockets, udp).
bool binds_to_ip_address(const std::string& provider);

}  // namespace ddp::detail::fabric

#include "ddp/env_vars.h"

namespace ddp::detail::fabric {

template <typename EfaProbe>
ProviderChoice choose_provider_from_env(EfaProbe&& efa_probe, int hosts, int ranks,
                                        const std::string& shm_blocker) {
  const auto ddp = env::get("DDP_FABRIC_PROVIDER");
  const auto fi = env::get("FI_PROVIDER");
  const bool explicit_choice = ddp || (fi && fi->find_first_of(",^") == std::string::npos);
  return choose_provider(ddp, fi, !explicit_choice && efa_probe(), hosts, ranks, shm_blocker);
}

}  // namespace ddp::detail::fabric
