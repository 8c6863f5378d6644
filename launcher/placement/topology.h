#pragma once
// The CPUs of this machine as the kernel describes them (sysfs, cgroup v2), read under a root
// directory so that tests can feed a fake tree: packages, physical cores and their hardware
// threads, L3 domains, NUMA nodes, and which CPUs (and how much CPU time) this process may use.
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace ddprun {

struct CpuInfo {
  int id = 0;
  int package = 0;  // topology/physical_package_id (0 where absent or negative)
  int core = 0;     // the lowest CPU of its thread_siblings_list: one value per physical core
  int l3 = -1;      // the lowest CPU sharing its level-3 cache; -1 when sysfs lists no L3
  int node = 0;     // its NUMA node (0 where the machine lists none)
};

struct CpuTopology {
  std::vector<CpuInfo> cpus;  // every online CPU, by id
  // The CPUs this process may run on: its affinity mask, the cgroup's cpuset.cpus.effective
  // (cgroup v2, where present) and the online CPUs, intersected.
  std::set<int> usable;
  // cpu.max (cgroup v2) as whole CPUs, rounded up: the cap on the node's total threads. None:
  // no quota ("max", or no such file).
  std::optional<int> cpu_quota;

  // The CPU `id`, or nullptr when it is not online.
  const CpuInfo* find(int id) const;
};

// Reads `root`/sys/devices/system/{cpu,node} and `root`/sys/fs/cgroup: the online CPUs (the
// "online" list, else every cpuN folder), per CPU its topology/{physical_package_id,core_id,
// thread_siblings_list} and cache/indexK/{level,shared_cpu_list}, the NUMA nodes' cpulist
// files, cpuset.cpus.effective and cpu.max. `affinity` is the process's affinity mask
// (current_affinity(); a test passes its own). Throws ddp::Error naming the file for a value
// it cannot parse, and when no CPU is online.
CpuTopology read_topology(const std::string& root, const std::set<int>& affinity);

// This process's affinity mask (sched_getaffinity). Throws ddp::Error if the kernel refuses.
std::set<int> current_affinity();

// `root`/sys/fs/cgroup/cpu.max as whole CPUs, rounded up (a quota of 1.5 CPUs is 2); none when
// the file is absent or says "max". Throws ddp::Error for a malformed file.
std::optional<int> read_cpu_quota(const std::string& root);

}  // namespace ddprun
