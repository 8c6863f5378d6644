#pragma once
// A fake sysfs tree in a temporary directory, for read_topology (placement/topology.h): the
// CPU, cache, NUMA node and cgroup files a machine would have, written by the test.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <stdexcept>
#include <string>

namespace ddprun::testing {

struct FakeCpu {
  int id = 0;
  int package = 0;
  int core_id = 0;
  std::string siblings;  // thread_siblings_list; "" writes none
  std::string l3;        // the L3's shared_cpu_list; "" writes no level-3 cache
};

class FakeSysfs {
 public:
  // In /dev/shm where it can be written: a tree of 192 CPUs is about 2,500 files, which a
  // journaling disk under load takes seconds to create and remove, and memory milliseconds.
  FakeSysfs() {
    const bool shm = access("/dev/shm", W_OK | X_OK) == 0;
    std::string dir =
        (shm ? std::string("/dev/shm") : std::filesystem::temp_directory_path().string()) +
        "/ddprun-fake-sysfs-XXXXXX";
    if (mkdtemp(dir.data()) == nullptr) throw std::runtime_error("mkdtemp failed: " + dir);
    root_ = dir;
  }
  ~FakeSysfs() { std::filesystem::remove_all(root_); }
  FakeSysfs(const FakeSysfs&) = delete;
  FakeSysfs& operator=(const FakeSysfs&) = delete;

  const std::string& root() const { return root_; }

  void write(const std::string& relative, const std::string& text) const {
    const std::filesystem::path path = std::filesystem::path(root_) / relative;
    std::filesystem::create_directories(path.parent_path());
    std::ofstream(path) << text;
  }

  // Its topology files and caches: L1d, L1i and L2 of its own (levels 1, 1, 2), and the L3.
  void add_cpu(const FakeCpu& cpu) const {
    const std::string dir = "sys/devices/system/cpu/cpu" + std::to_string(cpu.id) + "/";
    write(dir + "topology/physical_package_id", std::to_string(cpu.package) + "\n");
    write(dir + "topology/core_id", std::to_string(cpu.core_id) + "\n");
    if (!cpu.siblings.empty()) write(dir + "topology/thread_siblings_list", cpu.siblings + "\n");
    const std::string own = cpu.siblings.empty() ? std::to_string(cpu.id) : cpu.siblings;
    write(dir + "cache/index0/level", "1\n");
    write(dir + "cache/index0/shared_cpu_list", own + "\n");
    write(dir + "cache/index1/level", "1\n");
    write(dir + "cache/index1/shared_cpu_list", own + "\n");
    write(dir + "cache/index2/level", "2\n");
    write(dir + "cache/index2/shared_cpu_list", own + "\n");
    if (!cpu.l3.empty()) {
      write(dir + "cache/index3/level", "3\n");
      write(dir + "cache/index3/shared_cpu_list", cpu.l3 + "\n");
    }
  }
  void add_node(int node, const std::string& cpulist) const {
    write("sys/devices/system/node/node" + std::to_string(node) + "/cpulist", cpulist + "\n");
  }
  void set_online(const std::string& cpulist) const {
    write("sys/devices/system/cpu/online", cpulist + "\n");
  }
  void set_cpuset(const std::string& cpulist) const {
    write("sys/fs/cgroup/cpuset.cpus.effective", cpulist + "\n");
  }
  void set_cpu_max(const std::string& text) const { write("sys/fs/cgroup/cpu.max", text + "\n"); }

 private:
  std::string root_;
};

inline std::string range(int first, int last) {
  return std::to_string(first) + "-" + std::to_string(last);
}

// (a) One socket of 64 cores without SMT and one NUMA node (a Graviton3); an L3 for every
// `l3_cores` cores (64: one shared L3, as on Graviton3).
inline void one_socket_64_cores(const FakeSysfs& sys, int l3_cores) {
  sys.set_online("0-63");
  sys.add_node(0, "0-63");
  for (int cpu = 0; cpu < 64; ++cpu) {
    const int first = cpu / l3_cores * l3_cores;
    sys.add_cpu({cpu, 0, cpu, std::to_string(cpu), range(first, first + l3_cores - 1)});
  }
}

// (b) Two sockets of two NUMA nodes of 24 cores each, SMT: cpu N and N+96 are one core; an L3
// per NUMA node.
inline void two_sockets_smt(const FakeSysfs& sys) {
  sys.set_online("0-191");
  for (int node = 0; node < 4; ++node) {
    const int first = node * 24;
    const std::string cpus = range(first, first + 23) + "," + range(first + 96, first + 96 + 23);
    sys.add_node(node, cpus);
    for (int core = first; core < first + 24; ++core) {
      const std::string siblings = std::to_string(core) + "," + std::to_string(core + 96);
      sys.add_cpu({core, core / 48, core % 48, siblings, cpus});
      sys.add_cpu({core + 96, core / 48, core % 48, siblings, cpus});
    }
  }
}

// Every CPU from 0 to last: an affinity mask that allows all.
inline std::set<int> all_cpus(int last) {
  std::set<int> cpus;
  for (int cpu = 0; cpu <= last; ++cpu) cpus.insert(cpu);
  return cpus;
}

}  // namespace ddprun::testing
