#include "comm/fabric/fabric_connection.h"

#include <atomic>
#include <optional>
#include <vector>

#include "comm/fabric/address_exchange.h"
#include "comm/fabric/cross_memory_attach.h"
#include "comm/fabric/fabric_info.h"
#include "comm/fabric/fabric_transport.h"
#include "comm/fabric/host_identity.h"
#include "comm/fabric/message_tag.h"
#include "comm/fabric/provider_selection.h"
#include "comm/fabric/provider_tuning.h"
#include "comm/fabric/shm_region_names.h"
#include "ddp/env_vars.h"
#include "ddp/error.h"
#include "ddp/log.h"
#include "ddp/net/local_address.h"
#include "ddp/settings.h"
#include "ddp/store.h"

namespace ddp::detail::fabric {
namespace {

// The local IP a socket provider should bind to: the one routing to the store, except on the
// store's own host, whose route is loopback; there, the one routing to a rank elsewhere.
std::optional<std::string> source_address(const std::vector<HostIdentity>& hosts, int rank) {
  const auto& self = hosts[rank];
  if (self.route_address.empty()) return std::nullopt;
  if (!net::is_loopback(self.route_address)) return self.route_address;
  for (const auto& other : hosts) {
    if (other.host_key != self.host_key && !other.route_address.empty() &&
        !net::is_loopback(other.route_address)) {
      return net::local_address_towards(other.route_address);
    }
  }
  return self.route_address;  // every rank on this host: loopback is right
}

std::string bytes_text(std::size_t bytes) {
  if (bytes >= (std::size_t{1} << 40)) return "unlimited";
  if (bytes >= 1024 * 1024) return std::to_string(bytes >> 20) + " MiB";
  if (bytes >= 1024) return std::to_string(bytes >> 10) + " KiB";
  return std::to_string(bytes) + " B";
}

struct OpenedEndpoint {
  std::unique_ptr<FabricEndpoint> endpoint;
  std::string provider;
  collectives::AlgorithmConfig config;
};

// Why shm cannot copy large messages between the ranks (see cross_memory_attach.h); empty when
// it can. Every rank tests every other and publishes what it found, and all take the first
// failure in rank order, so that all choose alike even when only one direction is refused.
// Only asked when every rank is on this host, the one case where shm can be chosen and work,
// and then whatever provider is set: every rank waits for every other's record, so whether a
// rank takes part must not depend on its own environment.
std::string cross_memory_attach_blocker(Store& store, const std::vector<HostIdentity>& hosts,
                                        int rank) {
  const int size = static_cast<int>(hosts.size());
  std::string mine;
  try {
    mine = cma_disabled_by_environment();
    if (!mine.empty()) mine += " (unset it)";
  } catch (const Error& e) {
    mine = e.what();
    store.set("cma/" + std::to_string(rank), mine);
    publish_failure(store, rank, e.what());
    throw;
  }
  for (int r = 0; r < size && mine.empty(); ++r) {
    if (r == rank) continue;
    const std::string denied = cma_denied(hosts[r].pid, hosts[r].cma_probe);
    if (!denied.empty()) {
      mine = "rank " + std::to_string(rank) + " cannot read the memory of rank " +
             std::to_string(r) + " by cross-memory attach (" + denied +
             "; allow ptrace between the ranks: kernel.yama.ptrace_scope=0 on the node, or the "
             "SYS_PTRACE capability in the container's securityContext)";
    }
  }
  // A prefix keeps the value non-empty when there is nothing to report.
  const std::string checked = "checked:";
  store.set("cma/" + std::to_string(rank), checked + mine);
  for (int r = 0; r < size; ++r) {
    const std::string record = store.get("cma/" + std::to_string(r));
    const std::string theirs =
        record.rfind(checked, 0) == 0 ? record.substr(checked.size()) : record;
    if (!theirs.empty()) {
      return theirs +
             ", and without cross-memory attach libfabric 1.17's shm provider fails or stalls on "
             "every message above its inject size";
    }
  }
  return "";
}

// Why the shm regions of this host's ranks would not fit in /dev/shm; empty if they do. A
// region that outgrows a full tmpfs kills its process with SIGBUS, so this is checked first.
std::string shm_room(const std::vector<HostIdentity>& hosts, int rank) {
  const auto available = shm_bytes_available();
  if (!available) return "";
  int local_ranks = 0;
  for (const auto& h : hosts) local_ranks += h.host_key == hosts[rank].host_key ? 1 : 0;
  const unsigned long long needed = kShmRegionBytes * static_cast<unsigned long long>(local_ranks);
  if (*available >= needed) return "";
  return "/dev/shm has " + std::to_string(*available >> 20) + " MiB free and its " +
         std::to_string(local_ranks) + " shm regions need up to " + std::to_string(needed >> 20) +
         " MiB; mount a larger /dev/shm (Kubernetes: an emptyDir with medium Memory)";
}

// `cma_blocker`: see cross_memory_attach_blocker.
OpenedEndpoint open_endpoint(const std::vector<HostIdentity>& hosts, int rank, int size,
                             const std::string& cma_blocker, const CommOptions& options,
                             const std::string& group) {
  const int host_count = count_hosts(hosts);
  std::string shm_blocker = shm_room(hosts, rank);
  if (shm_blocker.empty()) shm_blocker = cma_blocker;
  const auto choice = choose_provider_from_env([] { return provider_present("efa"); }, host_count,
                                               size, shm_blocker, options.fabric_provider);
  if (choice.provider == "shm" && !shm_blocker.empty()) {
    throw ConfigError("libfabric provider shm (" + choice.reason + ") cannot run here: " +
                      shm_blocker + "; or set DDP_FABRIC_PROVIDER=tcp;ofi_rxm");
  }
  InfoQuery query{choice.provider, std::nullopt, std::nullopt};
  if (binds_to_ip_address(choice.provider) && !env::get("FI_TCP_IFACE")) {
    if (auto iface = options.socket_ifname ? options.socket_ifname
                                           : settings::text(settings::kSocketIfname)) {
      query.domain = *iface;
    } else {
      query.source_address = source_address(hosts, rank);
    }
  }
  std::string error;
  InfoPtr answer = query_fabric(query, &error);
  if (!answer) {
    throw ConfigError("libfabric provider '" + choice.provider + "' (" + choice.reason +
                      ") cannot open an RDM endpoint here (fi_getinfo: " + error +
                      (query.source_address ? " for address " + *query.source_address : "") +
                      (query.domain ? " for domain " + *query.domain : "") +
                      "); usable providers: " + providers_answering_hints() +
                      "; set DDP_FABRIC_PROVIDER to one of them (see `fi_info -l`)");
  }
  // EFA lists one domain per device: spread the ranks of a host over them.
  const bool per_device = choice.provider == "efa";
  InfoPtr info = pick_entry(
      answer.get(), per_device ? static_cast<std::size_t>(local_index(hosts, rank)) : 0, nullptr);
  OpenedEndpoint opened;
  opened.provider = info->fabric_attr->prov_name;
  opened.config =
      collectives::AlgorithmConfig::resolve(algorithm_defaults(opened.provider), options);
  const auto& config = opened.config;
  const std::string description =
      "provider " + opened.provider + " (" + choice.reason + "), fabric " +
      info->fabric_attr->name + ", domain " + info->domain_attr->name + "; " +
      std::to_string(size) + (size == 1 ? " rank on " : " ranks on ") + std::to_string(host_count) +
      (host_count == 1 ? " host" : " hosts") + ", inject " +
      bytes_text(info->tx_attr->inject_size) + ", max message " +
      bytes_text(info->ep_attr->max_msg_size) + ", ring from " +
      bytes_text(config.ring_threshold_bytes) + " in " + bytes_text(config.chunk_bytes) +
      " chunks taken " +
      (config.ring_order == collectives::RingOrder::kWavefront ? "in a wavefront"
                                                               : "step by step") +
      ", " + std::to_string(config.pipeline_depth) + " receives posted at once";
  const std::string who = group.empty() ? "fabric" : "fabric " + group;
  if (rank == 0 && group.empty()) {
    log::info("{}: {}", who, description);
  } else {
    log::debug("{}: {}", who, description);
  }
  std::string name;
  if (opened.provider == "shm") {
    static std::atomic<int> serial{0};
    if (const int reclaimed = reclaim_dead_shm_regions()) {
      log::debug("fabric: removed {} shared-memory regions left by dead processes", reclaimed);
    }
    name = shm_region_name(serial++);
  }
  opened.endpoint = std::make_unique<FabricEndpoint>(std::move(info), rank, name);
  return opened;
}

}  // namespace

FabricConnection connect_fabric(Store& store, int rank, int size, const CommOptions& options,
                                const std::string& group) {
  const auto timeout = options.timeout;
  if (size > kMaxRanks) {
    throw ConfigError("the fabric backend supports at most " + std::to_string(kMaxRanks) +
                      " ranks, got " + std::to_string(size));
  }
  // Groups connected one after another over the same store (every rank in the same order) each
  // get their own keys.
  const auto instance = store.add("instances/" + std::to_string(rank), 1);
  auto scoped = store.with_prefix(std::to_string(instance));

  const auto self = HostIdentity::current(store.endpoint_host());
  scoped->set("host/" + std::to_string(rank), self.serialize());
  std::vector<HostIdentity> hosts(size);
  for (int r = 0; r < size; ++r) {
    hosts[r] = HostIdentity::parse(scoped->get("host/" + std::to_string(r)));
  }

  std::string cma_blocker;
  if (size > 1 && count_hosts(hosts) == 1) {
    cma_blocker = cross_memory_attach_blocker(*scoped, hosts, rank);
  }
  OpenedEndpoint opened;
  try {
    opened = open_endpoint(hosts, rank, size, cma_blocker, options, group);
  } catch (const Error& e) {
    publish_failure(*scoped, rank, e.what());
    throw;
  }
  publish_endpoint(*scoped, rank, opened.provider, opened.endpoint->address());
  const auto addresses = collect_addresses(*scoped, rank, size, opened.provider);
  auto peers = opened.endpoint->insert_addresses(addresses);

  std::vector<std::optional<pid_t>> local_pids(size);
  for (int r = 0; r < size; ++r) {
    if (r != rank && hosts[r].host_key == self.host_key) local_pids[r] = hosts[r].pid;
  }
  FabricConnection connection;
  connection.provider = opened.provider;
  connection.config = opened.config;
  connection.transport =
      std::make_unique<FabricTransport>(std::move(opened.endpoint), std::move(peers), rank, timeout,
                                        PeerLiveness(std::move(local_pids)));
  return connection;
}

}  // namespace ddp::detail::fabric
