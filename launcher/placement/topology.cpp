#include "placement/topology.h"

#include <sched.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "ddp/error.h"
#include "placement/cpu_list.h"

namespace ddprun {
namespace {

namespace fs = std::filesystem;

// The file's text, or none when it does not exist or cannot be read.
std::optional<std::string> read_text(const fs::path& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::optional<int> read_int(const fs::path& path) {
  const auto text = read_text(path);
  if (!text) return std::nullopt;
  char* end = nullptr;
  const long value = std::strtol(text->c_str(), &end, 10);
  while (end != nullptr && std::isspace(static_cast<unsigned char>(*end))) ++end;
  if (end == text->c_str() || end == nullptr || *end != '\0') {
    throw ddp::Error(path.string() + ": '" + *text + "' is not a number");
  }
  return static_cast<int>(value);
}

std::optional<std::set<int>> read_cpu_list(const fs::path& path) {
  const auto text = read_text(path);
  if (!text) return std::nullopt;
  return parse_cpu_list(*text, path.string());
}

// The numbers N of the entries "<prefix>N" in `dir` (cpu0, node1, index3).
std::vector<int> numbered_entries(const fs::path& dir, const std::string& prefix) {
  std::vector<int> numbers;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) continue;
    const std::string digits = name.substr(prefix.size());
    if (digits.find_first_not_of("0123456789") != std::string::npos) continue;
    numbers.push_back(std::stoi(digits));
  }
  std::sort(numbers.begin(), numbers.end());
  return numbers;
}

std::set<int> online_cpus(const fs::path& cpu_dir) {
  if (auto online = read_cpu_list(cpu_dir / "online")) return *online;
  const auto found = numbered_entries(cpu_dir, "cpu");
  return {found.begin(), found.end()};
}

// The lowest CPU sharing this CPU's level-3 cache, or -1 when no cache index is level 3.
int l3_of(const fs::path& cpu_path) {
  for (int index : numbered_entries(cpu_path / "cache", "index")) {
    const fs::path dir = cpu_path / "cache" / ("index" + std::to_string(index));
    if (read_int(dir / "level") != 3) continue;
    const auto shared = read_cpu_list(dir / "shared_cpu_list");
    if (shared && !shared->empty()) return *shared->begin();
  }
  return -1;
}

// Package, core and L3 of each online CPU. A CPU without thread_siblings_list shares its core
// with the CPUs of the same package and core_id.
std::vector<CpuInfo> read_cpus(const fs::path& cpu_dir, const std::set<int>& online) {
  std::vector<CpuInfo> cpus;
  std::map<std::pair<int, int>, int> first_of_core;  // (package, core_id) -> lowest CPU
  for (int id : online) {
    const fs::path path = cpu_dir / ("cpu" + std::to_string(id));
    CpuInfo cpu;
    cpu.id = id;
    cpu.package = std::max(0, read_int(path / "topology/physical_package_id").value_or(0));
    const int core_id = read_int(path / "topology/core_id").value_or(id);
    const auto siblings = read_cpu_list(path / "topology/thread_siblings_list");
    if (siblings && !siblings->empty()) {
      cpu.core = std::min(id, *siblings->begin());
    } else {
      cpu.core = first_of_core.emplace(std::make_pair(cpu.package, core_id), id).first->second;
    }
    cpu.l3 = l3_of(path);
    cpus.push_back(cpu);
  }
  return cpus;
}

// Each CPU's NUMA node from node*/cpulist; every CPU is on node 0 where none is listed.
void read_nodes(const fs::path& node_dir, std::vector<CpuInfo>& cpus) {
  for (int node : numbered_entries(node_dir, "node")) {
    const auto listed = read_cpu_list(node_dir / ("node" + std::to_string(node)) / "cpulist");
    if (!listed) continue;
    for (auto& cpu : cpus) {
      if (listed->count(cpu.id) != 0) cpu.node = node;
    }
  }
}

}  // namespace

const CpuInfo* CpuTopology::find(int id) const {
  for (const auto& cpu : cpus) {
    if (cpu.id == id) return &cpu;
  }
  return nullptr;
}

std::optional<int> read_cpu_quota(const std::string& root) {
  const fs::path path = fs::path(root) / "sys/fs/cgroup/cpu.max";
  const auto text = read_text(path);
  if (!text) return std::nullopt;
  std::istringstream in(*text);
  std::string quota;
  double period = 0;
  if (!(in >> quota >> period) || period <= 0) {
    throw ddp::Error(path.string() + ": '" + *text +
                     "' is not '<quota> <period>' or 'max <period>'");
  }
  if (quota == "max") return std::nullopt;
  char* end = nullptr;
  const double micros = std::strtod(quota.c_str(), &end);
  if (end == quota.c_str() || *end != '\0' || micros <= 0) {
    throw ddp::Error(path.string() + ": quota '" + quota + "' is not a number of microseconds");
  }
  return std::max(1, static_cast<int>(std::ceil(micros / period)));
}

CpuTopology read_topology(const std::string& root, const std::set<int>& affinity) {
  const fs::path cpu_dir = fs::path(root) / "sys/devices/system/cpu";
  const std::set<int> online = online_cpus(cpu_dir);
  if (online.empty()) {
    throw ddp::Error(cpu_dir.string() + " lists no online CPU; is sysfs mounted under " + root +
                     "?");
  }
  CpuTopology topology;
  topology.cpus = read_cpus(cpu_dir, online);
  read_nodes(fs::path(root) / "sys/devices/system/node", topology.cpus);
  const auto cpuset = read_cpu_list(fs::path(root) / "sys/fs/cgroup/cpuset.cpus.effective");
  for (int cpu : online) {
    const bool in_cpuset = !cpuset || cpuset->empty() || cpuset->count(cpu) != 0;
    if (in_cpuset && affinity.count(cpu) != 0) topology.usable.insert(cpu);
  }
  topology.cpu_quota = read_cpu_quota(root);
  return topology;
}

std::set<int> current_affinity() {
  // Room for machines beyond CPU_SETSIZE (1024 CPUs).
  constexpr int kMaxCpus = 65536;
  const std::size_t size = CPU_ALLOC_SIZE(kMaxCpus);
  std::vector<unsigned long> mask(size / sizeof(unsigned long) + 1, 0);
  auto* set = reinterpret_cast<cpu_set_t*>(mask.data());
  if (sched_getaffinity(0, size, set) != 0) {
    throw ddp::Error(std::string("sched_getaffinity failed: ") + std::strerror(errno));
  }
  std::set<int> cpus;
  for (int cpu = 0; cpu < kMaxCpus; ++cpu) {
    if (CPU_ISSET_S(cpu, size, set)) cpus.insert(cpu);
  }
  return cpus;
}

}  // namespace ddprun
