#include "comm/fabric/proc_stat.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <sstream>

namespace ddp::detail::fabric {

std::optional<ProcStat> read_proc_stat(pid_t pid, bool* gone) {
  if (gone) *gone = false;
  const std::string path = "/proc/" + std::to_string(pid) + "/stat";
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (gone) *gone = errno == ENOENT || errno == ESRCH;
    return std::nullopt;
  }
  std::string text;
  char chunk[512];
  for (;;) {
    const ssize_t got = ::read(fd, chunk, sizeof(chunk));
    if (got > 0) {
      text.append(chunk, static_cast<std::size_t>(got));
      continue;
    }
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      if (gone) *gone = errno == ESRCH;
      ::close(fd);
      return std::nullopt;
    }
    break;
  }
  ::close(fd);
  // "pid (comm) S ppid ...": comm may hold spaces and parentheses, so parse after the last ')'.
  const auto close = text.rfind(')');
  if (close == std::string::npos || close + 2 >= text.size()) return std::nullopt;
  ProcStat stat;
  stat.state = text[close + 2];
  std::istringstream fields(text.substr(close + 2));
  std::string field;
  // Fields 3 (state) ... 8, 9 (flags), 10 ... 21, then 22 (starttime).
  for (int i = 0; i < 6; ++i) fields >> field;
  if (!(fields >> stat.flags)) return std::nullopt;
  for (int i = 0; i < 12; ++i) fields >> field;
  if (!(fields >> stat.start_time)) return std::nullopt;
  return stat;
}

}  // namespace ddp::detail::fabric
