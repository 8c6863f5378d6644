// --numa-binding's plans on fake machines: (a) one socket of 64 cores (an L3 per 16 cores, or
// one L3 as on Graviton3), (b) two sockets of two NUMA nodes of 24 SMT cores, (c) a cpuset of
// six odd CPUs on (b), and a small SMT machine; then this machine's own topology.
#include "placement/binding_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <iterator>
#include <numeric>

#include "ddp/error.h"
#include "fake_sysfs.h"
#include "placement/cpu_list.h"

namespace ddprun {
namespace {

using testing::FakeSysfs;

constexpr BindingPolicy kAllPolicies[] = {BindingPolicy::kNode, BindingPolicy::kSocket,
                                          BindingPolicy::kExclusive, BindingPolicy::kCoreComplex};

std::vector<RankPlacement> plan(const FakeSysfs& sys, int nproc, BindingPolicy policy,
                                const std::set<int>& affinity = testing::all_cpus(255)) {
  return plan_binding(read_topology(sys.root(), affinity), nproc, policy);
}

// "cpus (domain) threads" of every rank, one string per rank: compact expectations.
std::vector<std::string> lines(const std::vector<RankPlacement>& placements) {
  std::vector<std::string> out;
  for (const auto& p : placements) {
    out.push_back(format_cpu_list(p.cpus) + " (" + p.domain + ") " + std::to_string(p.threads));
  }
  return out;
}

// What every plan must be: one placement per rank, each a non-empty set of usable CPUs with at
// least one thread and no more threads than its physical cores; disjoint for exclusive; within
// the quota when the quota leaves each rank a thread.
void expect_valid(const CpuTopology& t, const std::vector<RankPlacement>& placements, int nproc,
                  BindingPolicy policy) {
  ASSERT_EQ(static_cast<int>(placements.size()), nproc);
  std::set<int> seen;
  int total = 0;
  for (const auto& p : placements) {
    ASSERT_FALSE(p.cpus.empty());
    EXPECT_TRUE(std::includes(t.usable.begin(), t.usable.end(), p.cpus.begin(), p.cpus.end()))
        << format_cpu_list(p.cpus) << " not within " << format_cpu_list(t.usable);
    EXPECT_GE(p.threads, 1);
    EXPECT_LE(p.threads, physical_cores(t, p.cpus));
    EXPECT_FALSE(p.domain.empty());
    total += p.threads;
    if (policy != BindingPolicy::kExclusive) continue;
    std::set<int> overlap;
    std::set_intersection(seen.begin(), seen.end(), p.cpus.begin(), p.cpus.end(),
                          std::inserter(overlap, overlap.end()));
    EXPECT_TRUE(overlap.empty()) << "shared: " << format_cpu_list(overlap);
    seen.insert(p.cpus.begin(), p.cpus.end());
  }
  if (t.cpu_quota && *t.cpu_quota >= nproc) {
    EXPECT_LE(total, *t.cpu_quota);
  }
}

// Both hardware threads of a core on (b) go to the same rank: N with N+96.
void expect_siblings_together(const std::vector<RankPlacement>& placements) {
  for (const auto& p : placements) {
    for (int cpu : p.cpus) {
      const int sibling = cpu < 96 ? cpu + 96 : cpu - 96;
      EXPECT_EQ(p.cpus.count(sibling), 1u) << cpu << " without " << sibling;
    }
  }
}

std::string refusal(const FakeSysfs& sys, int nproc, BindingPolicy policy) {
  try {
    plan(sys, nproc, policy);
  } catch (const ddp::ConfigError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a ConfigError";
  return "";
}

TEST(BindingPolicy, TorchrunsFourNamesAndAClearLineForAnyOther) {
  for (BindingPolicy policy : kAllPolicies) {
    EXPECT_EQ(parse_binding_policy("--numa-binding", to_string(policy)), policy);
  }
  try {
    parse_binding_policy("PET_NUMA_BINDING", "numa");
    ADD_FAILURE() << "expected a ConfigError";
  } catch (const ddp::ConfigError& e) {
    EXPECT_STREQ(e.what(),
                 "PET_NUMA_BINDING='numa' is not a binding; use node, socket, exclusive or "
                 "core-complex (torchrun's names), or leave it out for no binding");
  }
  EXPECT_THROW(parse_binding_policy("--numa-binding", "Node"), ddp::ConfigError);
  EXPECT_THROW(parse_binding_policy("--numa-binding", ""), ddp::ConfigError);
}

TEST(BindingPlan, DescribesARankInOneLine) {
  RankPlacement p{{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}, 16, "L3 0"};
  EXPECT_EQ(describe_placement("rank 0", p), "rank 0: cpus 0-15 (L3 0), 16 threads");
  EXPECT_EQ(describe_placement("local rank 3", {{5, 101}, 1, "node 0"}),
            "local rank 3: cpus 5,101 (node 0), 1 thread");
}

// (a) with an L3 per 16 cores.
TEST(BindingPlan, OneSocketOf64CoresWithFourL3s) {
  FakeSysfs sys;
  testing::one_socket_64_cores(sys, 16);
  EXPECT_EQ(lines(plan(sys, 1, BindingPolicy::kNode)),
            (std::vector<std::string>{"0-63 (node 0) 64"}));
  EXPECT_EQ(lines(plan(sys, 2, BindingPolicy::kNode)),
            (std::vector<std::string>{"0-63 (node 0) 32", "0-63 (node 0) 32"}));
  EXPECT_EQ(
      lines(plan(sys, 3, BindingPolicy::kSocket)),
      (std::vector<std::string>{"0-63 (socket 0) 21", "0-63 (socket 0) 21", "0-63 (socket 0) 21"}));
  EXPECT_EQ(lines(plan(sys, 4, BindingPolicy::kSocket)),
            std::vector<std::string>(4, "0-63 (socket 0) 16"));
  EXPECT_EQ(lines(plan(sys, 1, BindingPolicy::kExclusive)),
            (std::vector<std::string>{"0-63 (node 0) 64"}));
  EXPECT_EQ(lines(plan(sys, 2, BindingPolicy::kExclusive)),
            (std::vector<std::string>{"0-31 (node 0) 32", "32-63 (node 0) 32"}));
  EXPECT_EQ(
      lines(plan(sys, 3, BindingPolicy::kExclusive)),
      (std::vector<std::string>{"0-21 (node 0) 22", "22-42 (node 0) 21", "43-63 (node 0) 21"}));
  EXPECT_EQ(lines(plan(sys, 4, BindingPolicy::kExclusive)),
            (std::vector<std::string>{"0-15 (node 0) 16", "16-31 (node 0) 16", "32-47 (node 0) 16",
                                      "48-63 (node 0) 16"}));
  // One rank takes one core complex; fewer ranks than complexes spread over them; more share.
  EXPECT_EQ(lines(plan(sys, 1, BindingPolicy::kCoreComplex)),
            (std::vector<std::string>{"0-15 (L3 0) 16"}));
  EXPECT_EQ(lines(plan(sys, 2, BindingPolicy::kCoreComplex)),
            (std::vector<std::string>{"0-15 (L3 0) 16", "32-47 (L3 2) 16"}));
  EXPECT_EQ(lines(plan(sys, 3, BindingPolicy::kCoreComplex)),
            (std::vector<std::string>{"0-15 (L3 0) 16", "16-31 (L3 1) 16", "32-47 (L3 2) 16"}));
  EXPECT_EQ(lines(plan(sys, 4, BindingPolicy::kCoreComplex)),
            (std::vector<std::string>{"0-15 (L3 0) 16", "16-31 (L3 1) 16", "32-47 (L3 2) 16",
                                      "48-63 (L3 3) 16"}));
  EXPECT_EQ(lines(plan(sys, 5, BindingPolicy::kCoreComplex)),
            (std::vector<std::string>{"0-15 (L3 0) 8", "0-15 (L3 0) 8", "16-31 (L3 1) 16",
                                      "32-47 (L3 2) 16", "48-63 (L3 3) 16"}));
}

// (a) as Graviton3: one L3 shared by all 64 cores, so core-complex is the whole socket.
TEST(BindingPlan, OneSocketOf64CoresWithOneSharedL3) {
  FakeSysfs sys;
  testing::one_socket_64_cores(sys, 64);
  const CpuTopology t = read_topology(sys.root(), testing::all_cpus(63));
  for (int nproc : {1, 2, 4, 5}) {
    for (BindingPolicy policy : kAllPolicies) {
      SCOPED_TRACE(std::string(to_string(policy)) + " x" + std::to_string(nproc));
      expect_valid(t, plan_binding(t, nproc, policy), nproc, policy);
    }
  }
  EXPECT_EQ(lines(plan(sys, 1, BindingPolicy::kCoreComplex)),
            (std::vector<std::string>{"0-63 (L3 0) 64"}));
  EXPECT_EQ(lines(plan(sys, 2, BindingPolicy::kCoreComplex)),
            (std::vector<std::string>{"0-63 (L3 0) 32", "0-63 (L3 0) 32"}));
  EXPECT_EQ(lines(plan(sys, 5, BindingPolicy::kExclusive)),
            (std::vector<std::string>{"0-12 (node 0) 13", "13-25 (node 0) 13", "26-38 (node 0) 13",
                                      "39-51 (node 0) 13", "52-63 (node 0) 12"}));
}

// (b): node and socket spread ranks in blocks; siblings stay with their rank.
TEST(BindingPlan, TwoSmtSocketsNodeAndSocket) {
  FakeSysfs sys;
  testing::two_sockets_smt(sys);
  EXPECT_EQ(lines(plan(sys, 1, BindingPolicy::kNode)),
            (std::vector<std::string>{"0-23,96-119 (node 0) 24"}));
  EXPECT_EQ(lines(plan(sys, 2, BindingPolicy::kNode)),
            (std::vector<std::string>{"0-23,96-119 (node 0) 24", "48-71,144-167 (node 2) 24"}));
  EXPECT_EQ(lines(plan(sys, 4, BindingPolicy::kNode)),
            (std::vector<std::string>{"0-23,96-119 (node 0) 24", "24-47,120-143 (node 1) 24",
                                      "48-71,144-167 (node 2) 24", "72-95,168-191 (node 3) 24"}));
  EXPECT_EQ(lines(plan(sys, 5, BindingPolicy::kNode)),
            (std::vector<std::string>{"0-23,96-119 (node 0) 12", "0-23,96-119 (node 0) 12",
                                      "24-47,120-143 (node 1) 24", "48-71,144-167 (node 2) 24",
                                      "72-95,168-191 (node 3) 24"}));
  EXPECT_EQ(lines(plan(sys, 1, BindingPolicy::kSocket)),
            (std::vector<std::string>{"0-47,96-143 (socket 0) 48"}));
  EXPECT_EQ(lines(plan(sys, 2, BindingPolicy::kSocket)),
            (std::vector<std::string>{"0-47,96-143 (socket 0) 48", "48-95,144-191 (socket 1) 48"}));
  EXPECT_EQ(lines(plan(sys, 3, BindingPolicy::kSocket)),
            (std::vector<std::string>{"0-47,96-143 (socket 0) 24", "0-47,96-143 (socket 0) 24",
                                      "48-95,144-191 (socket 1) 48"}));
  EXPECT_EQ(
      lines(plan(sys, 4, BindingPolicy::kSocket)),
      (std::vector<std::string>{"0-47,96-143 (socket 0) 24", "0-47,96-143 (socket 0) 24",
                                "48-95,144-191 (socket 1) 24", "48-95,144-191 (socket 1) 24"}));
  EXPECT_EQ(lines(plan(sys, 4, BindingPolicy::kCoreComplex)),
            (std::vector<std::string>{"0-23,96-119 (L3 0) 24", "24-47,120-143 (L3 1) 24",
                                      "48-71,144-167 (L3 2) 24", "72-95,168-191 (L3 3) 24"}));
}

// (b): exclusive sets are disjoint, keep siblings together, and stay inside a NUMA node when
// the counts allow it (4 and 8 ranks); otherwise they are split evenly across nodes.
TEST(BindingPlan, TwoSmtSocketsExclusive) {
  FakeSysfs sys;
  testing::two_sockets_smt(sys);
  const CpuTopology t = read_topology(sys.root(), testing::all_cpus(191));
  for (int nproc : {1, 2, 3, 4, 5, 8, 96}) {
    SCOPED_TRACE(nproc);
    const auto placements = plan_binding(t, nproc, BindingPolicy::kExclusive);
    expect_valid(t, placements, nproc, BindingPolicy::kExclusive);
    expect_siblings_together(placements);
    std::set<int> all;
    for (const auto& p : placements) all.insert(p.cpus.begin(), p.cpus.end());
    EXPECT_EQ(all, t.usable) << "every core is used";
  }
  EXPECT_EQ(
      lines(plan_binding(t, 2, BindingPolicy::kExclusive)),
      (std::vector<std::string>{"0-47,96-143 (nodes 0-1) 48", "48-95,144-191 (nodes 2-3) 48"}));
  EXPECT_EQ(lines(plan_binding(t, 3, BindingPolicy::kExclusive)),
            (std::vector<std::string>{"0-31,96-127 (nodes 0-1) 32", "32-63,128-159 (nodes 1-2) 32",
                                      "64-95,160-191 (nodes 2-3) 32"}));
  EXPECT_EQ(lines(plan_binding(t, 4, BindingPolicy::kExclusive)),
            (std::vector<std::string>{"0-23,96-119 (node 0) 24", "24-47,120-143 (node 1) 24",
                                      "48-71,144-167 (node 2) 24", "72-95,168-191 (node 3) 24"}));
  const auto eight = plan_binding(t, 8, BindingPolicy::kExclusive);
  EXPECT_EQ(lines(eight)[1], "12-23,108-119 (node 0) 12");
  EXPECT_EQ(lines(eight)[2], "24-35,120-131 (node 1) 12");
  for (const auto& p : eight) EXPECT_EQ(p.domain.rfind("node ", 0), 0u) << p.domain;
  const auto five = plan_binding(t, 5, BindingPolicy::kExclusive);
  std::vector<int> threads;
  for (const auto& p : five) threads.push_back(p.threads);
  EXPECT_EQ(threads, (std::vector<int>{20, 19, 19, 19, 19}));
}

// (b) with more ranks than cores: hardware threads are split, one CPU each; more ranks than
// CPUs are refused in one line.
TEST(BindingPlan, ExclusiveFallsBackToHardwareThreadsThenRefuses) {
  FakeSysfs sys;
  testing::two_sockets_smt(sys);
  const CpuTopology t = read_topology(sys.root(), testing::all_cpus(191));
  const auto placements = plan_binding(t, 192, BindingPolicy::kExclusive);
  expect_valid(t, placements, 192, BindingPolicy::kExclusive);
  for (const auto& p : placements) {
    EXPECT_EQ(p.cpus.size(), 1u);
    EXPECT_EQ(p.threads, 1);
  }
  EXPECT_EQ(format_cpu_list(placements[0].cpus), "0");
  EXPECT_EQ(format_cpu_list(placements[1].cpus), "96") << "a core's threads stay adjacent";
  EXPECT_EQ(refusal(sys, 193, BindingPolicy::kExclusive),
            "--numa-binding exclusive: 193 workers but only 192 usable CPUs (0-191), and no two "
            "workers may share one; lower --nproc-per-node to 192 or less, or use --numa-binding "
            "node to share CPUs");
  // The shared policies give every rank its domain's CPUs whatever the count.
  expect_valid(t, plan_binding(t, 193, BindingPolicy::kNode), 193, BindingPolicy::kNode);
}

// A small SMT machine: two cores of two threads, siblings {0,2} and {1,3}.
TEST(BindingPlan, SmallSmtMachineKeepsSiblingsTogetherWhileItCan) {
  FakeSysfs sys;
  sys.set_online("0-3");
  for (int cpu = 0; cpu < 4; ++cpu) {
    sys.add_cpu({cpu, 0, cpu % 2, cpu % 2 == 0 ? "0,2" : "1,3", "0-3"});
  }
  EXPECT_EQ(lines(plan(sys, 2, BindingPolicy::kExclusive)),
            (std::vector<std::string>{"0,2 (node 0) 1", "1,3 (node 0) 1"}));
  EXPECT_EQ(lines(plan(sys, 3, BindingPolicy::kExclusive)),
            (std::vector<std::string>{"0,2 (node 0) 1", "1 (node 0) 1", "3 (node 0) 1"}));
  EXPECT_EQ(
      lines(plan(sys, 4, BindingPolicy::kExclusive)),
      (std::vector<std::string>{"0 (node 0) 1", "2 (node 0) 1", "1 (node 0) 1", "3 (node 0) 1"}));
  EXPECT_NE(refusal(sys, 5, BindingPolicy::kExclusive).find("5 workers but only 4 usable CPUs"),
            std::string::npos);
  EXPECT_EQ(lines(plan(sys, 1, BindingPolicy::kNode)),
            (std::vector<std::string>{"0-3 (node 0) 2"}));
}

// (c): a cpuset of six odd CPUs on (b), each a core of its own whose sibling is not allowed.
TEST(BindingPlan, ACpusetOfSixOddCpus) {
  FakeSysfs sys;
  testing::two_sockets_smt(sys);
  sys.set_cpuset("1,3,5,7,9,11");
  const CpuTopology t = read_topology(sys.root(), testing::all_cpus(191));
  EXPECT_EQ(t.usable, (std::set<int>{1, 3, 5, 7, 9, 11}));
  for (int nproc : {1, 2, 3, 4, 6}) {
    for (BindingPolicy policy : kAllPolicies) {
      SCOPED_TRACE(std::string(to_string(policy)) + " x" + std::to_string(nproc));
      expect_valid(t, plan_binding(t, nproc, policy), nproc, policy);
    }
  }
  EXPECT_EQ(lines(plan_binding(t, 2, BindingPolicy::kNode)),
            (std::vector<std::string>{"1,3,5,7,9,11 (node 0) 3", "1,3,5,7,9,11 (node 0) 3"}));
  EXPECT_EQ(lines(plan_binding(t, 1, BindingPolicy::kSocket)),
            (std::vector<std::string>{"1,3,5,7,9,11 (socket 0) 6"}));
  EXPECT_EQ(lines(plan_binding(t, 4, BindingPolicy::kCoreComplex)),
            std::vector<std::string>(4, "1,3,5,7,9,11 (L3 0) 1"));
  EXPECT_EQ(lines(plan_binding(t, 3, BindingPolicy::kExclusive)),
            (std::vector<std::string>{"1,3 (node 0) 2", "5,7 (node 0) 2", "9,11 (node 0) 2"}));
  EXPECT_EQ(lines(plan_binding(t, 4, BindingPolicy::kExclusive)),
            (std::vector<std::string>{"1,3 (node 0) 2", "5,7 (node 0) 2", "9 (node 0) 1",
                                      "11 (node 0) 1"}));
  EXPECT_EQ(refusal(sys, 7, BindingPolicy::kExclusive),
            "--numa-binding exclusive: 7 workers but only 6 usable CPUs (1,3,5,7,9,11), and no "
            "two workers may share one; lower --nproc-per-node to 6 or less, or use "
            "--numa-binding node to share CPUs");
}

// The cgroup's quota caps the node's total threads, in proportion, at least one per rank.
TEST(BindingPlan, TheCpuQuotaCapsTheNodesThreads) {
  FakeSysfs sys;
  testing::two_sockets_smt(sys);
  sys.set_cpu_max("800000 100000");
  const CpuTopology t = read_topology(sys.root(), testing::all_cpus(191));
  ASSERT_EQ(t.cpu_quota, 8);
  const auto threads_of = [&](int nproc, BindingPolicy policy) {
    std::vector<int> threads;
    for (const auto& p : plan_binding(t, nproc, policy)) threads.push_back(p.threads);
    return threads;
  };
  EXPECT_EQ(threads_of(4, BindingPolicy::kExclusive), (std::vector<int>{2, 2, 2, 2}));
  EXPECT_EQ(threads_of(5, BindingPolicy::kNode), (std::vector<int>{1, 1, 2, 2, 2}));
  EXPECT_EQ(threads_of(1, BindingPolicy::kSocket), (std::vector<int>{8}));
  EXPECT_EQ(threads_of(3, BindingPolicy::kExclusive), (std::vector<int>{2, 2, 2}));
  for (int nproc : {1, 2, 3, 4, 8}) {
    for (BindingPolicy policy : kAllPolicies) {
      SCOPED_TRACE(std::string(to_string(policy)) + " x" + std::to_string(nproc));
      expect_valid(t, plan_binding(t, nproc, policy), nproc, policy);
    }
  }
  // A quota below the rank count still leaves each rank one thread.
  sys.set_cpu_max("150000 100000");
  const CpuTopology small = read_topology(sys.root(), testing::all_cpus(191));
  ASSERT_EQ(small.cpu_quota, 2);
  const auto four = plan_binding(small, 4, BindingPolicy::kExclusive);
  for (const auto& p : four) EXPECT_EQ(p.threads, 1);
  // Within the quota nothing changes.
  sys.set_cpu_max("9600000 100000");
  const CpuTopology large = read_topology(sys.root(), testing::all_cpus(191));
  EXPECT_EQ(lines(plan_binding(large, 2, BindingPolicy::kSocket))[0], "0-47,96-143 (socket 0) 48");
}

// Without L3 in sysfs, core-complex falls back to the package.
TEST(BindingPlan, CoreComplexWithoutAnL3FallsBackToTheSocket) {
  FakeSysfs sys;
  sys.set_online("0-7");
  for (int cpu = 0; cpu < 8; ++cpu) sys.add_cpu({cpu, cpu / 4, cpu % 4, std::to_string(cpu), ""});
  EXPECT_EQ(lines(plan(sys, 2, BindingPolicy::kCoreComplex)),
            (std::vector<std::string>{"0-3 (socket 0) 4", "4-7 (socket 1) 4"}));
}

TEST(BindingPlan, AnAffinityThatLeavesNoCpuIsRefused) {
  FakeSysfs sys;
  testing::one_socket_64_cores(sys, 16);
  try {
    plan(sys, 1, BindingPolicy::kNode, {100, 101});
    ADD_FAILURE() << "expected a ConfigError";
  } catch (const ddp::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("may use none of the online CPUs"), std::string::npos)
        << e.what();
  }
}

TEST(BindingPlan, WithoutBindingAHintWhereOneThreadPerWorkerLeavesCpusIdle) {
  EXPECT_EQ(binding_hint(4, 64),
            "4 workers get OMP_NUM_THREADS=1 each (torchrun's rule) on 64 usable CPUs; "
            "--numa-binding exclusive gives each worker cores of its own and a thread per core");
  EXPECT_NE(binding_hint(2, 5), "");
  EXPECT_EQ(binding_hint(2, 4), "") << "two CPUs per worker: no hint";
  EXPECT_EQ(binding_hint(1, 64), "") << "one worker keeps all its threads";
  EXPECT_EQ(binding_hint(2, 2), "");
}

// This machine, read from "/": every policy plans 1 and 2 ranks (exclusive refuses 2 only on a
// machine with one usable CPU).
TEST(BindingPlan, ThisMachinesTopologyGivesAValidPlanForEveryPolicy) {
  const CpuTopology t = read_topology("/", current_affinity());
  ASSERT_FALSE(t.usable.empty());
  std::printf("this machine: %zu online CPUs, usable %s, quota %s\n", t.cpus.size(),
              format_cpu_list(t.usable).c_str(),
              t.cpu_quota ? std::to_string(*t.cpu_quota).c_str() : "none");
  for (int nproc : {1, 2}) {
    for (BindingPolicy policy : kAllPolicies) {
      SCOPED_TRACE(std::string(to_string(policy)) + " x" + std::to_string(nproc));
      if (policy == BindingPolicy::kExclusive && static_cast<int>(t.usable.size()) < nproc) {
        EXPECT_THROW(plan_binding(t, nproc, policy), ddp::ConfigError);
        continue;
      }
      const auto placements = plan_binding(t, nproc, policy);
      expect_valid(t, placements, nproc, policy);
      for (std::size_t lr = 0; lr < placements.size(); ++lr) {
        std::printf("  %s x%d: %s\n", to_string(policy), nproc,
                    describe_placement("rank " + std::to_string(lr), placements[lr]).c_str());
      }
    }
  }
}

}  // namespace
}  // namespace ddprun
