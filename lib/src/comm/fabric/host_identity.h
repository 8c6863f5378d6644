#pragma once
// Which ranks share a host in the sense that matters to libfabric's shm provider: the same
// kernel (boot id), the same hostname and the same pid and IPC namespaces, so that shared memory
// and cross-process reads (CMA) between them work. Two pods on one node count as two hosts. The
// key is Topology's node key (ddp/comm/topology.h).
#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace ddp::detail::fabric {

struct HostIdentity {
  std::string host_key;  // equal for processes that can use shm with each other
  pid_t pid = 0;
  std::string route_address;     // the local IP that routes towards the rendezvous store
  std::uintptr_t cma_probe = 0;  // where peers read to test cross-memory attach (0: unknown)

  // This process; `store_host` is where the rendezvous store lives.
  static HostIdentity current(const std::string& store_host);

  std::string serialize() const;
  // Throws ConfigError for a malformed record.
  static HostIdentity parse(const std::string& text);
};

// The number of distinct hosts among `ranks`.
int count_hosts(const std::vector<HostIdentity>& ranks);

// This rank's index among the ranks on its host (0 for the lowest rank there).
int local_index(const std::vector<HostIdentity>& ranks, int rank);

}  // namespace ddp::detail::fabric
