#include "comm/fabric/shm_region_names.h"

#include <dirent.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <climits>
#include <sstream>
#include <vector>

#include "comm/fabric/proc_stat.h"

namespace ddp::detail::fabric {
namespace {

constexpr const char* kPrefix = "ddp-";

std::string own_pid_namespace() {
  char target[PATH_MAX];
  const ssize_t length = ::readlink("/proc/self/ns/pid", target, sizeof(target) - 1);
  if (length <= 0) return "0";
  // "pid:[4026531836]" -> "4026531836"
  std::string text(target, static_cast<std::size_t>(length));
  const auto open = text.find('[');
  const auto close = text.find(']');
  if (open == std::string::npos || close == std::string::npos) return "0";
  return text.substr(open + 1, close - open - 1);
}

}  // namespace

std::optional<unsigned long long> process_start_time(pid_t pid) {
  const auto stat = read_proc_stat(pid);
  if (!stat) return std::nullopt;
  return stat->start_time;
}

std::string shm_region_name(int serial) {
  const pid_t pid = ::getpid();
  return std::string(kPrefix) + own_pid_namespace() + "-" + std::to_string(pid) + "-" +
         std::to_string(process_start_time(pid).value_or(0)) + "-" + std::to_string(serial);
}

std::optional<RegionOwner> parse_region_owner(const std::string& name) {
  if (name.rfind(kPrefix, 0) != 0) return std::nullopt;
  std::vector<std::string> parts;
  std::istringstream in(name.substr(4));
  for (std::string part; std::getline(in, part, '-');) parts.push_back(part);
  if (parts.size() != 4) return std::nullopt;
  try {
    RegionOwner owner;
    owner.pid_namespace = parts[0];
    owner.pid = static_cast<pid_t>(std::stol(parts[1]));
    owner.start_time = std::stoull(parts[2]);
    std::stoi(parts[3]);
    return owner;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

std::optional<unsigned long long> shm_bytes_available(const std::string& directory) {
  struct statvfs info {};
  if (::statvfs(directory.c_str(), &info) != 0) return std::nullopt;
  return static_cast<unsigned long long>(info.f_bavail) * info.f_frsize;
}

int reclaim_dead_shm_regions(const std::string& directory) {
  DIR* dir = ::opendir(directory.c_str());
  if (!dir) return 0;
  const std::string own_namespace = own_pid_namespace();
  std::vector<std::string> stale;
  while (const dirent* entry = ::readdir(dir)) {
    const auto owner = parse_region_owner(entry->d_name);
    // Another pid namespace's pids mean nothing here: leave those regions alone.
    if (!owner || owner->pid_namespace != own_namespace) continue;
    const auto running_since = process_start_time(owner->pid);
    if (!running_since || *running_since != owner->start_time) stale.push_back(entry->d_name);
  }
  ::closedir(dir);
  int removed = 0;
  for (const auto& name : stale) {
    if (::unlink((directory + "/" + name).c_str()) == 0) ++removed;
  }
  return removed;
}

}  // namespace ddp::detail::fabric
