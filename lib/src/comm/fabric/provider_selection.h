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

// choose_provider with DDP_FABRIC_PROVIDER and FI_PROVIDER from the environment, or with
// `in_code` (CommOptions::fabric_provider) where set; `efa_probe` runs only when nothing was
// chosen explicitly.
template <typename EfaProbe>
ProviderChoice choose_provider_from_env(EfaProbe&& efa_probe, int hosts, int ranks,
                                        const std::string& shm_blocker,
                                        const std::optional<std::string>& in_code = std::nullopt);

// Whether a name is a socket-based provider that binds to an IP address (tcp, sockets, udp).
bool binds_to_ip_address(const std::string& provider);

}  // namespace ddp::detail::fabric

#include "ddp/env_vars.h"
#include "ddp/settings.h"

namespace ddp::detail::fabric {

template <typename EfaProbe>
ProviderChoice choose_provider_from_env(EfaProbe&& efa_probe, int hosts, int ranks,
                                        const std::string& shm_blocker,
                                        const std::optional<std::string>& in_code) {
  if (in_code) return {*in_code, "set by CommOptions::fabric_provider"};
  // DDP_FABRIC_PROVIDER, or FI_PROVIDER (which may also be a filter such as "^efa").
  const auto ddp = env::get(settings::kFabricProvider.name);
  const auto fi = env::get(settings::kFabricProvider.fallback);
  const bool explicit_choice = ddp || (fi && fi->find_first_of(",^") == std::string::npos);
  return choose_provider(ddp, fi, !explicit_choice && efa_probe(), hosts, ranks, shm_blocker);
}

}  // namespace ddp::detail::fabric
