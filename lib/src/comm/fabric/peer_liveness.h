#pragma once
// Notices that a peer process on this host has exited, so a collective waiting for it fails at
// once instead of at the timeout (shm has no connection whose loss would tell). Peers on other
// hosts are not watched; for them the timeout, or a survivor's abort notice, ends the wait.
#include <sys/types.h>

#include <optional>
#include <vector>

namespace ddp::detail::fabric {

class PeerLiveness {
 public:
  PeerLiveness() = default;
  // pids[r] is rank r's pid when it shares this host's pid namespace, nullopt otherwise.
  explicit PeerLiveness(std::vector<std::optional<pid_t>> pids) : pids_(std::move(pids)) {}

  // The first watched rank among `candidates` (indexed by rank) whose process has exited or is
  // a zombie, if any.
  std::optional<int> first_exited(const std::vector<bool>& candidates) const;
  // The first watched rank of all whose process has exited or is a zombie, if any.
  std::optional<int> first_exited() const;
  std::optional<pid_t> pid_of(int rank) const;
  // Whether `rank` is watched and its process has exited or begun to (process_exiting).
  bool exiting(int rank) const;

 private:
  std::vector<std::optional<pid_t>> pids_;
};

// True when `pid` no longer runs: gone, or a zombie not yet reaped by its parent.
bool process_exited(pid_t pid);
// process_exited, or on its way there: the kernel has begun its exit (PF_EXITING), and closes its
// sockets before it becomes a zombie. Best-effort messages skip such peers: libfabric 1.17's
// ofi_rxm can crash sending to a peer whose connection is being torn down.
bool process_exiting(pid_t pid);

}  // namespace ddp::detail::fabric
