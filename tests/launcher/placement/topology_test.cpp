// read_topology on fake sysfs trees: cores, L3 domains, NUMA nodes, the cgroup's cpuset and
// quota, and the process's affinity.
#include "placement/topology.h"

#include <gtest/gtest.h>
#include <sched.h>

#include "ddp/error.h"
#include "fake_sysfs.h"

namespace ddprun {
namespace {

using testing::FakeSysfs;

TEST(Topology, ReadsPackagesCoresL3AndNodesOfTwoSmtSockets) {
  FakeSysfs sys;
  testing::two_sockets_smt(sys);
  const CpuTopology t = read_topology(sys.root(), testing::all_cpus(191));
  ASSERT_EQ(t.cpus.size(), 192u);
  EXPECT_EQ(t.usable, testing::all_cpus(191));
  EXPECT_FALSE(t.cpu_quota.has_value());
  const CpuInfo* cpu = t.find(130);  // core 34: socket 0, node 1, siblings 34 and 130
  ASSERT_NE(cpu, nullptr);
  EXPECT_EQ(cpu->package, 0);
  EXPECT_EQ(cpu->core, 34);
  EXPECT_EQ(cpu->node, 1);
  EXPECT_EQ(cpu->l3, 24);
  cpu = t.find(95);
  ASSERT_NE(cpu, nullptr);
  EXPECT_EQ(cpu->package, 1);
  EXPECT_EQ(cpu->core, 95);
  EXPECT_EQ(cpu->node, 3);
  EXPECT_EQ(cpu->l3, 72);
  EXPECT_EQ(t.find(192), nullptr);
}

TEST(Topology, UsableCpusAreTheAffinityTheCpusetAndTheOnlineOnes) {
  FakeSysfs sys;
  testing::one_socket_64_cores(sys, 16);
  sys.set_online("0-2,4-63");  // cpu3 is offline (its folder stays)
  sys.set_cpuset("0-7,60-63");
  const CpuTopology t = read_topology(sys.root(), {0, 1, 2, 3, 4, 5, 40, 60, 61});
  EXPECT_EQ(t.usable, (std::set<int>{0, 1, 2, 4, 5, 60, 61}));
  EXPECT_EQ(t.cpus.size(), 63u);
  EXPECT_EQ(t.find(3), nullptr);
}

TEST(Topology, WithoutAnOnlineListEveryCpuFolderCounts) {
  FakeSysfs sys;
  for (int cpu = 0; cpu < 4; ++cpu) sys.add_cpu({cpu, 0, cpu, std::to_string(cpu), "0-3"});
  const CpuTopology t = read_topology(sys.root(), testing::all_cpus(3));
  EXPECT_EQ(t.cpus.size(), 4u);
  EXPECT_EQ(t.usable, testing::all_cpus(3));
  for (const auto& cpu : t.cpus) EXPECT_EQ(cpu.node, 0) << "no node folder: one node";
}

TEST(Topology, MissingSiblingsAndL3FallBackToCoreIdAndNone) {
  FakeSysfs sys;
  sys.set_online("0-3");
  // Two cores of two threads each, told only by core_id; no L3 anywhere.
  for (int cpu = 0; cpu < 4; ++cpu) sys.add_cpu({cpu, 0, cpu % 2, "", ""});
  const CpuTopology t = read_topology(sys.root(), testing::all_cpus(3));
  ASSERT_EQ(t.cpus.size(), 4u);
  EXPECT_EQ(t.find(2)->core, 0);
  EXPECT_EQ(t.find(3)->core, 1);
  for (const auto& cpu : t.cpus) EXPECT_EQ(cpu.l3, -1);
}

TEST(Topology, CpuMaxIsTheQuotaInWholeCpusRoundedUp) {
  FakeSysfs sys;
  testing::one_socket_64_cores(sys, 64);
  sys.set_cpu_max("max 100000");
  EXPECT_FALSE(read_topology(sys.root(), testing::all_cpus(63)).cpu_quota.has_value());
  sys.set_cpu_max("400000 100000");
  EXPECT_EQ(read_topology(sys.root(), testing::all_cpus(63)).cpu_quota, 4);
  sys.set_cpu_max("150000 100000");
  EXPECT_EQ(read_cpu_quota(sys.root()), 2);
  sys.set_cpu_max("1000 100000");
  EXPECT_EQ(read_cpu_quota(sys.root()), 1);
  sys.set_cpu_max("lots 100000");
  EXPECT_THROW(read_cpu_quota(sys.root()), ddp::Error);
  EXPECT_FALSE(read_cpu_quota("/nonexistent-root").has_value());
}

TEST(Topology, AMalformedFileIsNamedAndNoCpuIsAnError) {
  FakeSysfs sys;
  testing::one_socket_64_cores(sys, 64);
  sys.add_node(0, "0-63x");
  try {
    read_topology(sys.root(), testing::all_cpus(63));
    ADD_FAILURE() << "expected a ddp::Error";
  } catch (const ddp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("node0/cpulist: '0-63x' is not a CPU list"),
              std::string::npos)
        << e.what();
  }
  FakeSysfs empty;
  EXPECT_THROW(read_topology(empty.root(), testing::all_cpus(3)), ddp::Error);
}

TEST(Topology, ThisProcessesAffinityIsWhatTheKernelSays) {
  const std::set<int> mine = current_affinity();
  ASSERT_FALSE(mine.empty());
  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);
  EXPECT_EQ(static_cast<int>(mine.size()), CPU_COUNT(&set));
  for (int cpu : mine) EXPECT_TRUE(cpu >= CPU_SETSIZE || CPU_ISSET(cpu, &set)) << cpu;
}

}  // namespace
}  // namespace ddprun
