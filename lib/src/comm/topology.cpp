#include "ddp/comm/topology.h"

#include <unistd.h>

#include <algorithm>
#include <climits>
#include <fstream>
#include <map>

#include "ddp/error.h"
#include "ddp/settings.h"
#include "ddp/store.h"

namespace ddp {
namespace {

std::string read_first_line(const char* path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

std::string link_target(const char* path) {
  char buffer[PATH_MAX];
  const ssize_t length = ::readlink(path, buffer, sizeof(buffer) - 1);
  return length > 0 ? std::string(buffer, static_cast<std::size_t>(length)) : std::string();
}

}  // namespace

Topology::Topology(const std::vector<std::string>& node_keys, int rank) : rank_(rank) {
  const int size = static_cast<int>(node_keys.size());
  if (rank < 0 || rank >= size) {
    throw ConfigError("topology: rank " + std::to_string(rank) + " outside [0, " +
                      std::to_string(size) + ")");
  }
  std::map<std::string, int> node_by_key;
  node_of_.resize(size);
  local_rank_.resize(size);
  for (int r = 0; r < size; ++r) {
    auto [it, added] = node_by_key.emplace(node_keys[r], static_cast<int>(members_.size()));
    if (added) members_.emplace_back();
    node_of_[r] = it->second;
    local_rank_[r] = static_cast<int>(members_[it->second].size());
    members_[it->second].push_back(r);
  }
}

int Topology::local_rank_of(int rank) const { return local_rank_[rank]; }

bool Topology::uniform() const {
  return std::all_of(members_.begin(), members_.end(),
                     [&](const auto& m) { return m.size() == members_.front().size(); });
}

std::string Topology::describe() const {
  std::size_t low = members_.front().size();
  std::size_t high = low;
  for (const auto& m : members_) {
    low = std::min(low, m.size());
    high = std::max(high, m.size());
  }
  const std::string nodes_text =
      std::to_string(members_.size()) + (members_.size() == 1 ? " node × " : " nodes × ");
  if (low == high) return nodes_text + std::to_string(low) + (low == 1 ? " rank" : " ranks");
  return nodes_text + std::to_string(low) + "-" + std::to_string(high) + " ranks (uneven)";
}

namespace detail {

std::string node_key() {
  if (auto fake = settings::text(settings::kTestHostId)) return "test:" + *fake;
  char hostname[HOST_NAME_MAX + 1] = {0};
  ::gethostname(hostname, sizeof(hostname) - 1);
  return std::string(hostname) + "/" + read_first_line("/proc/sys/kernel/random/boot_id") + "/" +
         link_target("/proc/self/ns/pid") + "/" + link_target("/proc/self/ns/ipc");
}

Topology exchange_topology(Store& store, int rank, int size) {
  if (size == 1) return Topology({node_key()}, 0);
  // Communicators connected one after another over the same store (every rank in the same
  // order) each read their own keys, never the last one's.
  const auto instance = store.add("topology/instances/" + std::to_string(rank), 1);
  const std::string prefix = "topology/" + std::to_string(instance) + "/";
  store.set(prefix + std::to_string(rank), node_key());
  std::vector<std::string> keys;
  keys.reserve(static_cast<std::size_t>(size));
  for (int r = 0; r < size; ++r) keys.push_back(prefix + std::to_string(r));
  return Topology(store.multi_get(keys), rank);  // waits for every key first
}

}  // namespace detail
}  // namespace ddp
