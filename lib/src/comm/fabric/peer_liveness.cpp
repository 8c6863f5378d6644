#include "comm/fabric/peer_liveness.h"

#include <cerrno>
#include <csignal>
#include <fstream>
#include <string>

namespace ddp::detail::fabric {

bool process_exited(pid_t pid) {
  if (::kill(pid, 0) != 0 && errno == ESRCH) return true;
  // /proc/<pid>/stat is "pid (comm) S ..."; comm may hold spaces, so read after the last ')'.
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  const auto close = text.rfind(')');
  // No readable /proc: kill() said the process exists, and the next check will see it go.
  if (close == std::string::npos || close + 2 >= text.size()) return false;
  const char state = text[close + 2];
  return state == 'Z' || state == 'X';
}

std::optional<int> PeerLiveness::first_exited(const std::vector<bool>& candidates) const {
  for (std::size_t r = 0; r < pids_.size() && r < candidates.size(); ++r) {
    if (candidates[r] && pids_[r] && process_exited(*pids_[r])) return static_cast<int>(r);
  }
  return std::nullopt;
}

std::optional<pid_t> PeerLiveness::pid_of(int rank) const {
  if (rank < 0 || static_cast<std::size_t>(rank) >= pids_.size()) return std::nullopt;
  return pids_[rank];
}

}  // namespace ddp::detail::fabric
