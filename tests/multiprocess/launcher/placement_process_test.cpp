// --numa-binding through the real ddprun: shell workers print the CPUs the kernel lets them use
// and the thread count they got; the agent's plan lines must match. Hard time bounds; each
// ChildProcess kills its process group.
#include <gtest/gtest.h>
#include <sched.h>

#include <map>
#include <regex>
#include <set>
#include <string>

#include "child_process.h"
#include "ddp/exit_codes.h"

namespace ddprun::testing {
namespace {

using std::chrono::seconds;

const std::string kDdprun = DDPRUN_PATH;
const char kReport[] =
    "grep Cpus_allowed_list /proc/self/status; echo \"threads=$OMP_NUM_THREADS "
    "openblas=$OPENBLAS_NUM_THREADS mkl=$MKL_NUM_THREADS\"";

int usable_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  return sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 1;
}

std::set<int> parse_list(const std::string& text) {
  std::set<int> cpus;
  std::regex item("([0-9]+)(?:-([0-9]+))?");
  for (std::sregex_iterator it(text.begin(), text.end(), item), end; it != end; ++it) {
    const int first = std::stoi((*it)[1]);
    const int last = (*it)[2].matched ? std::stoi((*it)[2]) : first;
    for (int cpu = first; cpu <= last; ++cpu) cpus.insert(cpu);
  }
  return cpus;
}

struct Seen {
  std::string planned_cpus;  // the agent's plan line
  std::string planned_threads;
  std::string allowed;  // the worker's Cpus_allowed_list
  std::string threads;  // its OMP_NUM_THREADS
  std::string openblas;
};

// Each rank's plan line (agent) and report (worker), by rank.
std::map<int, Seen> collect(const std::string& out) {
  std::map<int, Seen> ranks;
  const std::regex plan("\\] rank ([0-9]+): cpus ([0-9,-]+) \\([a-zL0-9 -]+\\), ([0-9]+) threads?");
  // Teed lines (--tee 3): "[default<local rank>]:", the rank on one node.
  const std::regex allowed("\\[default([0-9]+)\\]:Cpus_allowed_list:\\s*([0-9,-]+)");
  const std::regex threads("\\[default([0-9]+)\\]:threads=([0-9]*) openblas=([0-9]*)");
  for (std::sregex_iterator it(out.begin(), out.end(), plan), end; it != end; ++it) {
    ranks[std::stoi((*it)[1])].planned_cpus = (*it)[2];
    ranks[std::stoi((*it)[1])].planned_threads = (*it)[3];
  }
  for (std::sregex_iterator it(out.begin(), out.end(), allowed), end; it != end; ++it) {
    ranks[std::stoi((*it)[1])].allowed = (*it)[2];
  }
  for (std::sregex_iterator it(out.begin(), out.end(), threads), end; it != end; ++it) {
    ranks[std::stoi((*it)[1])].threads = (*it)[2];
    ranks[std::stoi((*it)[1])].openblas = (*it)[3];
  }
  return ranks;
}

// Two ranks (and as many as the usable CPUs, --nproc-per-node cpu) with exclusive sets: the
// kernel's mask of each worker is its plan line's, the sets are disjoint, and the thread count
// is the plan's; on a two-CPU machine, one CPU and one thread each.
TEST(DdprunPlacement, ExclusiveBindsEachRankToItsOwnCpusAndThreadCount) {
  if (usable_cpus() < 2) GTEST_SKIP() << "needs 2 usable CPUs, this process has 1";
  for (const std::string nproc : {"2", "cpu"}) {
    SCOPED_TRACE("--nproc-per-node " + nproc);
    ChildProcess run(
        {kDdprun, "--standalone", "--nproc-per-node", nproc, "--numa-binding", "exclusive", "--tee",
         "3", "/bin/sh", "-c", kReport},
        {{"OMP_NUM_THREADS", ""}, {"OPENBLAS_NUM_THREADS", ""}, {"MKL_NUM_THREADS", ""}});
    ASSERT_EQ(run.wait(seconds(60)), 0) << run.output();
    const std::string out = run.output();
    const auto ranks = collect(out);
    // 'cpu' is the usable CPUs, capped by a cgroup quota: the agent's summary line says.
    std::smatch workers;
    ASSERT_TRUE(std::regex_search(out, workers, std::regex("([0-9]+) workers? per node"))) << out;
    if (nproc == "cpu") {
      EXPECT_LE(std::stoi(workers[1]), usable_cpus()) << out;
    } else {
      EXPECT_EQ(workers[1], "2") << out;
    }
    ASSERT_EQ(ranks.size(), std::stoul(workers[1])) << out;
    std::set<int> seen;
    for (const auto& [rank, s] : ranks) {
      SCOPED_TRACE("rank " + std::to_string(rank));
      ASSERT_FALSE(s.planned_cpus.empty()) << out;
      EXPECT_EQ(parse_list(s.allowed), parse_list(s.planned_cpus)) << out;
      EXPECT_EQ(s.threads, s.planned_threads) << out;
      EXPECT_EQ(s.openblas, s.planned_threads) << out;
      for (int cpu : parse_list(s.allowed)) EXPECT_TRUE(seen.insert(cpu).second) << cpu << out;
      if (usable_cpus() == 2) {
        EXPECT_EQ(parse_list(s.allowed).size(), 1u) << out;
        EXPECT_EQ(s.threads, "1") << out;
      }
    }
  }
}

// The user's OMP_NUM_THREADS wins over the plan's count; the binding stays.
TEST(DdprunPlacement, TheUsersOmpNumThreadsWins) {
  if (usable_cpus() < 2) GTEST_SKIP() << "needs 2 usable CPUs, this process has 1";
  ChildProcess run({kDdprun, "--standalone", "--nproc-per-node", "2", "--numa-binding", "exclusive",
                    "--tee", "3", "/bin/sh", "-c", kReport},
                   {{"OMP_NUM_THREADS", "5"}, {"OPENBLAS_NUM_THREADS", ""}});
  ASSERT_EQ(run.wait(seconds(60)), 0) << run.output();
  const std::string out = run.output();
  const auto ranks = collect(out);
  ASSERT_EQ(ranks.size(), 2u) << out;
  for (const auto& [rank, s] : ranks) {
    EXPECT_EQ(s.threads, "5") << rank << out;
    EXPECT_EQ(s.openblas, "") << "OpenBLAS falls back to OMP_NUM_THREADS: " << out;
    EXPECT_EQ(parse_list(s.allowed), parse_list(s.planned_cpus)) << out;
  }
  EXPECT_NE(out.find("OMP_NUM_THREADS=5 from the environment wins over the plan's thread counts"),
            std::string::npos)
      << out;
}

// More ranks than usable CPUs: exclusive refuses before any worker starts, in one line, 64.
TEST(DdprunPlacement, ExclusiveRefusesMoreRanksThanCpus) {
  const int cpus = usable_cpus();
  ChildProcess run({kDdprun, "--standalone", "--nproc-per-node", std::to_string(cpus + 1),
                    "--numa-binding", "exclusive", "/bin/sh", "-c", kReport},
                   {});
  EXPECT_EQ(run.wait(seconds(30)), ddp::exit_code::kConfig) << run.output();
  const std::string out = run.output();
  EXPECT_NE(out.find("--numa-binding exclusive: " + std::to_string(cpus + 1) +
                     " workers but only " + std::to_string(cpus) + " usable CPUs"),
            std::string::npos)
      << out;
  EXPECT_EQ(out.find("Cpus_allowed_list:"), std::string::npos) << "a worker started: " << out;

  ChildProcess bad({kDdprun, "--standalone", "--numa-binding", "numa", "/bin/true"}, {});
  EXPECT_EQ(bad.wait(seconds(30)), ddp::exit_code::kConfig) << bad.output();
  EXPECT_NE(bad.output().find("--numa-binding='numa' is not a binding; use node, socket, "
                              "exclusive or core-complex"),
            std::string::npos)
      << bad.output();
}

}  // namespace
}  // namespace ddprun::testing
