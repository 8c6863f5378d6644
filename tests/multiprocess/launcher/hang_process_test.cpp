// Hang diagnosis end to end: two ddprun agents on loopback (2 nodes x 2 ranks), one rank made to
// hold the others up in three ways; node 0's agent must name it, its node and the op, within the
// warning threshold plus a few seconds, with its stack. A healthy job never reports.
// Every test has hard deadlines and kills what it started (see child_process.h).
#include <gtest/gtest.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "child_process.h"
#include "ddp/exit_codes.h"
#include "multiprocess.h"

namespace ddprun::testing {
namespace {

using std::chrono::seconds;

const std::string kDdprun = DDPRUN_PATH;
const std::string kWorker = WORKER_PATH;
constexpr int kWarnSec = 3;

std::vector<std::string> node_cmd(int node, int port, const std::vector<std::string>& worker) {
  std::vector<std::string> argv = {kDdprun,
                                   "--nnodes",
                                   "2",
                                   "--node-rank",
                                   std::to_string(node),
                                   "--nproc-per-node",
                                   "2",
                                   "--master-addr",
                                   "127.0.0.1",
                                   "--master-port",
                                   std::to_string(port),
                                   "--monitor-interval",
                                   "0.05",
                                   "--shutdown-timeout",
                                   "2",
                                   "--tee",
                                   "3"};
  argv.insert(argv.end(), worker.begin(), worker.end());
  return argv;
}

std::vector<std::string> hanging_worker(const std::string& mode, int iterations = 40) {
  return {kWorker,
          "--iterations",
          std::to_string(iterations),
          "--interval-ms",
          "50",
          "--hang-rank",
          "3",
          "--hang-at",
          "10",
          "--hang-mode",
          mode,
          "--hang-seconds",
          "12"};
}

struct Job {
  int port;
  ChildProcess node1;
  ChildProcess node0;
  Job(const std::vector<std::string>& worker, const std::map<std::string, std::string>& env)
      : port(ddp::testing::free_tcp_port()),
        node1(node_cmd(1, port, worker), env),
        node0(node_cmd(0, port, worker), env) {}
  std::vector<pid_t> worker_pids() const {
    auto pids = printed_pids(node0.output(), "worker rank=0 pid=");
    for (const auto& [out, key] : {std::pair{node0.output(), "worker rank=1 pid="},
                                   std::pair{node1.output(), "worker rank=2 pid="},
                                   std::pair{node1.output(), "worker rank=3 pid="}}) {
      for (pid_t p : printed_pids(out, key)) pids.push_back(p);
    }
    return pids;
  }
};

std::map<std::string, std::string> hang_env(int timeout_sec = 120) {
  return {{"DDP_HANG_WARN_SEC", std::to_string(kWarnSec)},
          {"DDP_TIMEOUT_SEC", std::to_string(timeout_sec)}};
}

// The seconds in "wait in it for X s" of the diagnosis line.
double waited_seconds(const std::string& out) {
  std::smatch m;
  const std::regex re("wait in it for ([0-9.]+) s");
  if (!std::regex_search(out, m, re)) return -1;
  return std::stod(m[1]);
}

// The op the hanging rank announced: "rank=3 hangs (MODE) before allreduce #N".
std::string announced_op(const std::string& out) {
  std::smatch m;
  const std::regex re("rank=3 hangs \\([a-z]+\\) before (allreduce #[0-9]+)");
  return std::regex_search(out, m, re) ? m[1].str() : "?";
}

// The diagnosis came before the failure's root-cause summary, which quotes it, as does the error
// file.
void expect_diagnosis_precedes_the_failure(const std::string& out0) {
  const auto diagnosis = out0.find("has not entered");
  const auto root_cause = out0.find("root cause (first failure)");
  ASSERT_NE(root_cause, std::string::npos) << out0;
  EXPECT_LT(diagnosis, root_cause) << out0;
  EXPECT_NE(out0.find("a hang preceded it:", root_cause), std::string::npos) << out0;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(out0, m, std::regex("error file: (/[^\\s]+)"))) << out0;
  std::ifstream file(m[1].str());
  std::stringstream text;
  text << file.rdbuf();
  EXPECT_NE(text.str().find("\"hang_diagnosis\": \"hang: rank 3 (node 1, "), std::string::npos)
      << text.str();
}

TEST(HangDiagnosisProcess, NamesAStoppedRankItsNodeAndOpWithItsStack) {
  Job job(hanging_worker("stop"), hang_env());
  ASSERT_TRUE(job.node0.wait_for_output("has not entered", seconds(60))) << job.node0.output();
  ASSERT_TRUE(job.node1.wait_for_output("hang (node 0's agent has the stacks)", seconds(10)))
      << job.node1.output();
  const std::string out0 = job.node0.output();
  const std::string op = announced_op(job.node1.output());
  EXPECT_NE(out0.find("hang: rank 3 (node 1, "), std::string::npos) << out0;
  EXPECT_NE(out0.find("has not entered " + op + " (4 B float32"), std::string::npos) << op << "\n"
                                                                                     << out0;
  EXPECT_NE(out0.find("ranks 0-2 wait in it for"), std::string::npos) << out0;
  EXPECT_NE(out0.find("is stopped (SIGSTOP)"), std::string::npos) << out0;
  EXPECT_NE(out0.find("its stack:"), std::string::npos) << out0;
  EXPECT_NE(out0.find("raise"), std::string::npos) << out0;  // where it stopped itself
  const double waited = waited_seconds(out0);
  EXPECT_GE(waited, kWarnSec) << out0;
  EXPECT_LE(waited, kWarnSec + 6) << out0;
  EXPECT_EQ(count_of(out0, "has not entered"), 1) << "one diagnosis per round\n" << out0;
  const auto pids = job.worker_pids();
  job.node0.kill_group();
  job.node1.kill_group();
  EXPECT_TRUE(wait_all_dead(pids, seconds(20)));
}

TEST(HangDiagnosisProcess, NamesARankThatSleepsBeforeACollective) {
  Job job(hanging_worker("sleep"), hang_env());
  ASSERT_TRUE(job.node0.wait_for_output("has not entered", seconds(60))) << job.node0.output();
  const std::string out0 = job.node0.output();
  EXPECT_NE(out0.find("hang: rank 3 (node 1, "), std::string::npos) << out0;
  EXPECT_NE(out0.find("has not entered " + announced_op(job.node1.output())), std::string::npos)
      << out0;
  EXPECT_NE(out0.find("is sleeping"), std::string::npos) << out0;
  EXPECT_NE(out0.find("nanosleep"), std::string::npos) << out0;  // its stack
  const double waited = waited_seconds(out0);
  EXPECT_GE(waited, kWarnSec) << out0;
  EXPECT_LE(waited, kWarnSec + 6) << out0;
  // The sleeper wakes up and the job finishes.
  EXPECT_EQ(job.node0.wait(seconds(60)), 0) << job.node0.output();
  EXPECT_EQ(job.node1.wait(seconds(20)), 0) << job.node1.output();
}

// Rank 3 skips one allreduce; the others then wait in their last one, which it never runs, until
// their op timeout. The diagnosis comes first and is part of the failure's summary.
TEST(HangDiagnosisProcess, NamesARankThatSkippedACollectiveBeforeTheTimeout) {
  const int iterations = 20;
  Job job(hanging_worker("skip", iterations), hang_env(12));
  ASSERT_TRUE(job.node0.wait_for_output("has not entered", seconds(60))) << job.node0.output();
  EXPECT_EQ(job.node0.wait(seconds(60)), ddp::exit_code::kComm) << job.node0.output();
  EXPECT_EQ(job.node1.wait(seconds(30)), ddp::exit_code::kComm) << job.node1.output();
  const std::string out0 = job.node0.output();
  const std::string last = "allreduce #" + std::to_string(iterations);
  EXPECT_NE(out0.find("hang: rank 3 (node 1, "), std::string::npos) << out0;
  EXPECT_NE(out0.find("has not entered " + last + " "), std::string::npos) << out0;
  EXPECT_NE(out0.find("last finished allreduce #" + std::to_string(iterations - 1) + " "),
            std::string::npos)
      << out0;
  expect_diagnosis_precedes_the_failure(out0);
  EXPECT_NE(job.node1.output().find("a hang preceded it:"), std::string::npos)
      << job.node1.output();
}

TEST(HangDiagnosisProcess, AHealthyJobNeverReports) {
  // 80 allreduces 100 ms apart: 8 s of training, four times the 2 s threshold, yet no collective
  // waits long.
  Job job({kWorker, "--iterations", "80", "--interval-ms", "100"},
          {{"DDP_HANG_WARN_SEC", "2"}, {"DDP_TIMEOUT_SEC", "120"}});
  EXPECT_EQ(job.node0.wait(seconds(90)), 0) << job.node0.output();
  EXPECT_EQ(job.node1.wait(seconds(30)), 0) << job.node1.output();
  EXPECT_EQ(job.node0.output().find("hang"), std::string::npos) << job.node0.output();
  EXPECT_EQ(job.node1.output().find("hang"), std::string::npos) << job.node1.output();
}

// Python workers (Debian's torch 1.13, gloo) keep no flight recorder: ddprun tells the ranks
// waiting in c10d from the one that is not by their main threads' native stacks, and asks the
// one it names for its Python stack (the script registered faulthandler on SIGUSR1).
class PythonHang : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::system("/usr/bin/python3 -c 'import torch.distributed' >/dev/null 2>&1") != 0) {
      GTEST_SKIP() << "/usr/bin/python3 cannot import torch.distributed; install python3-torch "
                      "(scripts/install-deps) to run this test";
    }
    if (std::system("eu-stack --version >/dev/null 2>&1") != 0) {
      GTEST_SKIP() << "eu-stack is missing; install elfutils (scripts/install-deps)";
    }
  }

  static std::vector<std::string> script(const std::string& mode, int iterations, int seconds,
                                         int timeout) {
    return {std::string(TEST_SOURCE_DIR) + "/gloo_hang.py",
            mode,
            "3",
            std::to_string(iterations),
            std::to_string(seconds),
            std::to_string(timeout)};
  }
  static std::map<std::string, std::string> env(int warn_sec) {
    return {{"PYTHON_EXEC", "/usr/bin/python3"},
            {"GLOO_SOCKET_IFNAME", "lo"},
            {"DDP_HANG_WARN_SEC", std::to_string(warn_sec)},
            {"DDP_PY_STACK_SIGNAL", "SIGUSR1"},
            // With --tee 3 (node_cmd), each worker line names its global rank.
            {"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", "[rank${rank}]:"}};
  }
  static std::vector<pid_t> pids(const Job& job) {
    auto all = printed_pids(job.node0.output(), "python rank=0 pid=");
    for (const auto& [out, key] : {std::pair{job.node0.output(), "python rank=1 pid="},
                                   std::pair{job.node1.output(), "python rank=2 pid="},
                                   std::pair{job.node1.output(), "python rank=3 pid="}}) {
      for (pid_t p : printed_pids(out, key)) all.push_back(p);
    }
    return all;
  }
};

TEST_F(PythonHang, NamesTheRankThatSleepsAndPrintsItsPythonStack) {
  Job job(script("sleep", 12, 15, 60), env(kWarnSec));
  ASSERT_TRUE(job.node0.wait_for_output("has not entered", seconds(90))) << job.node0.output();
  const std::string out0 = job.node0.output();
  EXPECT_NE(out0.find("hang: rank 3 (node 1, "), std::string::npos) << out0;
  EXPECT_NE(out0.find("has not entered a torch.distributed collective; ranks 0-2 wait in it for"),
            std::string::npos)
      << out0;
  EXPECT_NE(out0.find("in no torch.distributed call"), std::string::npos) << out0;
  EXPECT_NE(out0.find("nanosleep"), std::string::npos) << out0;  // its native stack
  const double waited = waited_seconds(out0);
  EXPECT_GE(waited, kWarnSec) << out0;
  EXPECT_LE(waited, kWarnSec + 8) << out0;
  // Its agent asks it for its Python stack: faulthandler's traceback in its output.
  ASSERT_TRUE(job.node1.wait_for_output("in <module>", seconds(20))) << job.node1.output();
  const std::string out1 = job.node1.output();
  EXPECT_NE(out1.find("sent SIGUSR1 to rank 3"), std::string::npos) << out1;
  EXPECT_TRUE(std::regex_search(out1, std::regex("\\[rank3\\]: +File \"[^\"]*gloo_hang\\.py\", "
                                                 "line [0-9]+ in <module>")))
      << out1;
  // The sleeper wakes up and the job finishes.
  EXPECT_EQ(job.node0.wait(seconds(90)), 0) << job.node0.output();
  EXPECT_EQ(job.node1.wait(seconds(30)), 0) << job.node1.output();
  EXPECT_EQ(count_of(job.node0.output(), "has not entered"), 1) << job.node0.output();
}

TEST_F(PythonHang, NamesAStoppedRank) {
  Job job(script("stop", 12, 0, 120), env(kWarnSec));
  ASSERT_TRUE(job.node0.wait_for_output("has not entered", seconds(90))) << job.node0.output();
  const std::string out0 = job.node0.output();
  EXPECT_NE(out0.find("hang: rank 3 (node 1, "), std::string::npos) << out0;
  EXPECT_NE(out0.find("is stopped (SIGSTOP)"), std::string::npos) << out0;
  const auto all = pids(job);
  job.node0.kill_group();
  job.node1.kill_group();
  EXPECT_TRUE(wait_all_dead(all, seconds(20)));
}

// Rank 3 skips an allreduce and sleeps instead of its last: the others wait in their last one
// until gloo's timeout fails them. The diagnosis comes first, and is part of the failure.
TEST_F(PythonHang, NamesTheRankBeforeTheTimeoutFailsTheJob) {
  Job job(script("skip", 10, 60, 15), env(kWarnSec));
  ASSERT_TRUE(job.node0.wait_for_output("has not entered", seconds(90))) << job.node0.output();
  EXPECT_NE(job.node0.wait(seconds(90)), 0) << job.node0.output();
  EXPECT_NE(job.node1.wait(seconds(30)), 0) << job.node1.output();
  const std::string out0 = job.node0.output();
  EXPECT_NE(out0.find("hang: rank 3 (node 1, "), std::string::npos) << out0;
  expect_diagnosis_precedes_the_failure(out0);
}

// The same with PyTorch 2.6 workers (the trixie root of tests/interop/prepare-torch2-root, the
// ctest fixture interop.torch2_root): their stacks tell the same story.
TEST_F(PythonHang, NamesTheRankThatSleepsAmongTorch2Workers) {
  const std::string root = "/var/cache/ddprun/torch2-trixie";
  if (geteuid() != 0 || !std::filesystem::exists(root + "/.ddprun-torch2-ready")) {
    GTEST_SKIP() << "needs root and the PyTorch 2.6 root " << root
                 << " (tests/interop/prepare-torch2-root, the ctest fixture interop.torch2_root)";
  }
  auto torch2 = env(kWarnSec);
  torch2["PYTHON_EXEC"] = std::string(INTEROP_DIR) + "/torch2-python";
  torch2["DDP_TORCH2_BIND"] = TEST_SOURCE_DIR;
  Job job(script("sleep", 12, 20, 60), torch2);
  ASSERT_TRUE(job.node0.wait_for_output("has not entered", seconds(120))) << job.node0.output();
  EXPECT_NE(job.node0.output().find("hang: rank 3 (node 1, "), std::string::npos)
      << job.node0.output();
  EXPECT_NE(job.node0.output().find("has not entered a torch.distributed collective; ranks 0-2 "
                                    "wait in it for"),
            std::string::npos)
      << job.node0.output();
  ASSERT_TRUE(job.node1.wait_for_output("in <module>", seconds(30))) << job.node1.output();
  EXPECT_EQ(job.node0.wait(seconds(120)), 0) << job.node0.output();
  EXPECT_EQ(job.node1.wait(seconds(30)), 0) << job.node1.output();
}

TEST_F(PythonHang, AHealthyPythonJobNeverReports) {
  // 160 allreduces 50 ms apart: 8 s, four times the 2 s threshold.
  // (The script's name holds "hang": the agents' lines are "] hang: ...", "] hang (...".)
  Job job(script("healthy", 160, 0, 60), env(2));
  EXPECT_EQ(job.node0.wait(seconds(120)), 0) << job.node0.output();
  EXPECT_EQ(job.node1.wait(seconds(30)), 0) << job.node1.output();
  EXPECT_EQ(job.node0.output().find("] hang"), std::string::npos) << job.node0.output();
  EXPECT_EQ(job.node1.output().find("] hang"), std::string::npos) << job.node1.output();
  EXPECT_NE(job.node0.output().find("python rank=0 done"), std::string::npos) << job.node0.output();
}

}  // namespace
}  // namespace ddprun::testing
