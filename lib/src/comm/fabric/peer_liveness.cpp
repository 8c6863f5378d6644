#include "comm/fabric/peer_liveness.h"

#include <cerrno>
#include <csignal>

#include "comm/fabric/proc_stat.h"

namespace ddp::detail::fabric {

namespace {

enum class ExitStage { kRunning, kExiting, kExited };

ExitStage exit_stage(pid_t pid) {
  constexpr unsigned long kPfExiting = 0x4;  // include/linux/sched.h
  if (::kill(pid, 0) != 0 && errno == ESRCH) return ExitStage::kExited;
  bool gone = false;
  const auto stat = read_proc_stat(pid, &gone);
  // Unreadable for another reason (no /proc): kill() said the process exists, and a later
  // check will see it go.
  if (!stat) return gone ? ExitStage::kExited : ExitStage::kRunning;
  if (stat->state == 'Z' || stat->state == 'X') return ExitStage::kExited;
  return (stat->flags & kPfExiting) != 0 ? ExitStage::kExiting : ExitStage::kRunning;
}

}  // namespace

bool process_exited(pid_t pid) { return exit_stage(pid) == ExitStage::kExited; }

bool process_exiting(pid_t pid) { return exit_stage(pid) != ExitStage::kRunning; }

std::optional<int> PeerLiveness::first_exited(const std::vector<bool>& candidates) const {
  for (std::size_t r = 0; r < pids_.size() && r < candidates.size(); ++r) {
    if (candidates[r] && pids_[r] && process_exited(*pids_[r])) return static_cast<int>(r);
  }
  return std::nullopt;
}

std::optional<int> PeerLiveness::first_exited() const {
  return first_exited(std::vector<bool>(pids_.size(), true));
}

std::optional<pid_t> PeerLiveness::pid_of(int rank) const {
  if (rank < 0 || static_cast<std::size_t>(rank) >= pids_.size()) return std::nullopt;
  return pids_[rank];
}

bool PeerLiveness::exiting(int rank) const {
  const auto pid = pid_of(rank);
  return pid && process_exiting(*pid);
}

}  // namespace ddp::detail::fabric
