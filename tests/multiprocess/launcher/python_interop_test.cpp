// An unchanged Python torch.distributed script (env:// init, gloo) runs under ddprun: with
// Debian's python3-torch 1.13 across two agents (nodes) on loopback with two workers each, and
// with PyTorch 2.6 (the trixie root of tests/interop/prepare-torch2-root, the ctest fixture
// interop.torch2_root) as workers of this ddprun, one node and two, and with ddprun itself
// copied into that root, as a user copies it into their own PyTorch image. Restarts and elastic
// membership changes form the group again with either version: each round's workers get a
// store of their own (launcher/rendezvous/rendezvous.h), torchrun's opt-out of sharing included.
// And ddprun's console shows a script's lines as torchrun 2.6's does, side by side.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>

#include "child_process.h"
#include "multiprocess.h"

namespace ddprun::testing {
namespace {

using std::chrono::seconds;

const std::string kScript = std::string(TEST_SOURCE_DIR) + "/gloo_allreduce.py";
const std::string kRestartScript = std::string(TEST_SOURCE_DIR) + "/gloo_restart.py";
const std::string kElasticScript = std::string(TEST_SOURCE_DIR) + "/gloo_elastic.py";
const std::string kFileTimerScript = std::string(TEST_SOURCE_DIR) + "/file_timer.py";
const std::string kTorch2Python = std::string(INTEROP_DIR) + "/torch2-python";

// `nodes` agents of two workers each on loopback; each agent's argv is `prefix`, `ddprun` (if
// any) and ddprun's arguments. Each worker line names its global rank (--tee 3 and
// TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE='[rank${rank}]:').
void run_job(int nodes, const std::vector<std::string>& prefix, const std::string& ddprun,
             std::map<std::string, std::string> env, const std::string& expect_version) {
  env["TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"] = "[rank${rank}]:";
  const int port = ddp::testing::free_tcp_port();
  std::vector<std::unique_ptr<ChildProcess>> agents;
  for (int n = 0; n < nodes; ++n) {
    std::vector<std::string> argv = prefix;
    if (!ddprun.empty()) argv.push_back(ddprun);
    for (const std::string& a :
         {std::string("--nnodes"), std::to_string(nodes), std::string("--node_rank"),
          std::to_string(n), std::string("--nproc_per_node"), std::string("2"),
          std::string("--master_addr"), std::string("127.0.0.1"), std::string("--master_port"),
          std::to_string(port), std::string("--tee"), std::string("3"), kScript}) {
      argv.push_back(a);
    }
    agents.push_back(std::make_unique<ChildProcess>(argv, env));
  }
  std::string all;
  for (auto& a : agents) {
    EXPECT_EQ(a->wait(seconds(300)), 0) << a->output();
    all += a->output();
  }
  const int world = 2 * nodes;
  const double sum = world * (world + 1) / 2.0;
  for (int r = 0; r < world; ++r) {
    char line[160];
    std::snprintf(line, sizeof(line), "[rank%d]:python rank=%d world=%d sum=%.1f expected=%.1f", r,
                  r, world, sum, sum);
    EXPECT_NE(all.find(line), std::string::npos) << line << "\n" << all;
  }
  EXPECT_NE(all.find("torch " + expect_version), std::string::npos) << all;
}

TEST(DdprunPython, GlooAllreduceAcrossTwoNodesOfTwoWorkers) {
  if (std::system("/usr/bin/python3 -c 'import torch.distributed' >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "/usr/bin/python3 cannot import torch.distributed; install python3-torch "
                    "(scripts/install-deps) to run this test";
  }
  run_job(2, {}, DDPRUN_PATH, {{"PYTHON_EXEC", "/usr/bin/python3"}, {"GLOO_SOCKET_IFNAME", "lo"}},
          "1.13");
}

// A script that brings its own store (init_method="tcp://..." on a port of its own): torch
// 1.13-2.x, seeing TORCHELASTIC_USE_AGENT_STORE=True, make every rank a client of that port and
// nobody serves it (30 minutes under torchrun); ddprun's Python hook has rank 0 serve it. With the
// hook off, the ranks give up after the script's 20 s timeout: the hook is what makes it work.
TEST(DdprunPython, AScriptsOwnTcpStoreWorksUnderTheAgentStoreFlag) {
  if (std::system("/usr/bin/python3 -c 'import torch.distributed' >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "/usr/bin/python3 cannot import torch.distributed; install python3-torch "
                    "(scripts/install-deps) to run this test";
  }
  const std::string init = "tcp://127.0.0.1:" + std::to_string(ddp::testing::free_tcp_port());
  run_job(2, {}, DDPRUN_PATH,
          {{"PYTHON_EXEC", "/usr/bin/python3"},
           {"GLOO_SOCKET_IFNAME", "lo"},
           {"GLOO_INIT_METHOD", init}},
          "1.13");
  ChildProcess off({DDPRUN_PATH, "--standalone", "--nproc-per-node", "2", kScript},
                   {{"PYTHON_EXEC", "/usr/bin/python3"},
                    {"GLOO_SOCKET_IFNAME", "lo"},
                    {"GLOO_INIT_METHOD", init},
                    {"GLOO_INIT_TIMEOUT", "20"},
                    {"DDP_PYTHON_HOOK", "off"}});
  EXPECT_NE(off.wait(seconds(120)), 0) << off.output();
  EXPECT_EQ(off.output().find("python rank="), std::string::npos) << off.output();
}

// PyTorch 2.x workers open every store connection with VALIDATE and speak the 2.1+ query codes.
// They run in a chroot of their own mount namespace: root only (CI runs as root).
std::map<std::string, std::string> torch2_env() {
  return {{"PYTHON_EXEC", kTorch2Python},
          {"GLOO_SOCKET_IFNAME", "lo"},
          {"DDP_TORCH2_BIND", std::string(TEST_SOURCE_DIR) + ":" + INTEROP_DIR + ":" +
                                  std::filesystem::path(DDPRUN_PATH).parent_path().string()}};
}

#define REQUIRE_ROOT() \
  if (geteuid() != 0) GTEST_SKIP() << "needs root: PyTorch 2.6 runs in a chroot (torch2-python)"

TEST(DdprunPython, Torch2WorkersOnOneNode) {
  REQUIRE_ROOT();
  run_job(1, {}, DDPRUN_PATH, torch2_env(), "2.");
}

TEST(DdprunPython, Torch2WorkersOnTwoNodes) {
  REQUIRE_ROOT();
  run_job(2, {}, DDPRUN_PATH, torch2_env(), "2.");
}

TEST(DdprunPython, Torch2ScriptsOwnTcpStoreWorksUnderTheAgentStoreFlag) {
  REQUIRE_ROOT();
  auto env = torch2_env();
  env["GLOO_INIT_METHOD"] = "tcp://127.0.0.1:" + std::to_string(ddp::testing::free_tcp_port());
  run_job(1, {}, DDPRUN_PATH, env, "2.");
}

// TORCHELASTIC_ENABLE_FILE_TIMER=1 with torch 2.6's own FileTimerClient: a section released in
// time costs nothing, one that expires gets its worker SIGKILLed, and the failure names it.
TEST(DdprunPython, Torch2FileTimerExpiryKillsTheWorkerAndNamesTheScope) {
  REQUIRE_ROOT();
  auto env = torch2_env();
  env["TORCHELASTIC_ENABLE_FILE_TIMER"] = "1";
  ChildProcess run(
      {DDPRUN_PATH, "--standalone", "--nproc-per-node", "2", "--tee", "3", kFileTimerScript}, env);
  const std::optional<int> code = run.wait(seconds(120));
  const std::string out = run.output();
  EXPECT_EQ(code, std::optional<int>(128 + SIGKILL)) << out;
  EXPECT_NE(out.find("[default0]:python rank=0 torch 2."), std::string::npos) << out;
  EXPECT_NE(out.find("[default1]:python rank=1 torch 2."), std::string::npos) << out;
  EXPECT_EQ(out.find("outlived its timer"), std::string::npos) << out;
  EXPECT_NE(out.find("its timer 'stuck_step' expired: the file-timer watchdog sent SIGKILL"),
            std::string::npos)
      << out;
}

// The worker lines of a console (those holding "console "), sorted: the order of two workers'
// lines, and of a worker's two streams, is the scheduler's under either launcher.
std::vector<std::string> console_lines(const std::string& output) {
  std::vector<std::string> lines;
  std::istringstream in(output);
  for (std::string line; std::getline(in, line);) {
    if (line.find("console ") != std::string::npos) lines.push_back(line);
  }
  std::sort(lines.begin(), lines.end());
  return lines;
}

// Side by side with torchrun 2.6 (python -m torch.distributed.run of the trixie root), the same
// script and flags: ddprun's console holds the same worker lines, byte for byte. Without --tee
// as the workers wrote them ("\r" and all); with --tee 3 after "[default<local rank>]:", each
// "\r" ending a line; TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE's expansion; and nothing of a stream
// redirected without --tee.
TEST(DdprunPython, ConsoleLinesMatchTorchrun26) {
  REQUIRE_ROOT();
  struct Case {
    std::vector<std::string> flags;
    std::string line_template;  // "": unset
    std::size_t lines;          // per launcher, of both workers
    std::string one_of_them;
  };
  const std::string kTemplate = "<${role_name}|${rank}|${local_rank}|$host> ";
  for (const Case& c : {
           Case{{}, "", 6, "console bar rank=1 50%\rconsole bar rank=1 100%\r"},
           Case{{"--tee", "3"}, "", 8, "[default1]:console bar rank=1 50%"},
           Case{{"--tee", "3", "--role", "trainer"},
                kTemplate,
                8,
                "<trainer|1|1|$host> console err rank=1 local_rank=1"},
           Case{{"--redirects", "1", "--tee", "2"},
                "",
                2,
                "[default0]:console err rank=0 local_rank=0"},
       }) {
    std::string flags;
    for (const auto& f : c.flags) flags += f + " ";
    SCOPED_TRACE("flags: " + flags + "template: " + c.line_template);
    std::vector<std::vector<std::string>> seen;
    for (const bool torchrun : {true, false}) {
      std::vector<std::string> argv = {DDPRUN_PATH};
      auto env = torch2_env();
      if (torchrun) {
        argv = {kTorch2Python, "-m", "torch.distributed.run"};
        env["PYTHON_EXEC"] = "";  // torchrun reads it too: its workers run its own python3
      }
      const int port = ddp::testing::free_tcp_port();
      for (const std::string& a :
           {std::string("--nnodes"), std::string("1"), std::string("--nproc-per-node"),
            std::string("2"), std::string("--rdzv-backend"), std::string("c10d"),
            std::string("--rdzv-endpoint"), "127.0.0.1:" + std::to_string(port),
            std::string("--local-addr"), std::string("127.0.0.1")}) {
        argv.push_back(a);
      }
      argv.insert(argv.end(), c.flags.begin(), c.flags.end());
      argv.push_back(std::string(TEST_SOURCE_DIR) + "/console_lines.py");
      if (!c.line_template.empty()) env["TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"] = c.line_template;
      ChildProcess run(argv, env);
      ASSERT_EQ(run.wait(seconds(180)), 0)
          << (torchrun ? "torchrun: " : "ddprun: ") << run.output();
      seen.push_back(console_lines(run.output()));
      EXPECT_EQ(seen.back().size(), c.lines) << run.output();
    }
    EXPECT_EQ(seen[1], seen[0]) << "ddprun's lines (left) differ from torchrun's (right)";
    EXPECT_NE(std::find(seen[1].begin(), seen[1].end(), c.one_of_them), seen[1].end())
        << "no line '" << c.one_of_them << "'";
  }
}

TEST(DdprunPython, DdprunCopiedIntoAPyTorch2RootRunsOneAndTwoNodeJobs) {
  REQUIRE_ROOT();
  // ddprun runs inside the root (its glibc, its python3), as the one binary copied into a
  // user's image; workers are that root's python3.
  auto env = torch2_env();
  env["DDP_TORCH2_EXEC"] = DDPRUN_PATH;
  env.erase("PYTHON_EXEC");
  run_job(1, {kTorch2Python}, "", env, "2.");
  run_job(2, {kTorch2Python}, "", env, "2.");
}

std::map<std::string, std::string> torch113_env() {
  return {{"PYTHON_EXEC", "/usr/bin/python3"}, {"GLOO_SOCKET_IFNAME", "lo"}};
}

#define REQUIRE_TORCH113()                                                                   \
  if (std::system("/usr/bin/python3 -c 'import torch.distributed' >/dev/null 2>&1") != 0)    \
  GTEST_SKIP() << "/usr/bin/python3 cannot import torch.distributed; install python3-torch " \
                  "(scripts/install-deps) to run this test"

// c10d rendezvous at 127.0.0.1:port, one worker per node, as torchelastic's examples run.
std::vector<std::string> c10d_flags(int port, const std::string& nnodes, const std::string& id) {
  return {DDPRUN_PATH,
          "--nnodes",
          nnodes,
          "--nproc-per-node",
          "1",
          "--rdzv-backend",
          "c10d",
          "--rdzv-endpoint",
          "127.0.0.1:" + std::to_string(port),
          "--rdzv-id",
          id,
          "--monitor-interval",
          "0.05",
          "--rdzv-conf",
          "last_call_timeout=0.5"};
}

// Two nodes whose last rank leaves attempt 0 (gloo_restart.py), `runs` times: every restart
// must form the group again. Returns the number that did; each failure's output is reported.
int completed_restarts(int runs, std::map<std::string, std::string> env) {
  int completed = 0;
  for (int run = 0; run < runs; ++run) {
    const int port = ddp::testing::free_tcp_port();
    std::vector<std::unique_ptr<ChildProcess>> agents;
    for (int n = 0; n < 2; ++n) {
      auto argv = c10d_flags(port, "2", "restart" + std::to_string(run));
      argv.insert(argv.end(), {"--max-restarts", "1", kRestartScript});
      agents.push_back(std::make_unique<ChildProcess>(argv, env));
    }
    bool ok = true;
    std::string all;
    for (auto& a : agents) {
      ok = a->wait(seconds(120)) == 0 && ok;
      all += a->output();
    }
    ok = ok && count_of(all, "attempt=1 sum=3.0 expected=3.0") == 2;
    if (!ok) ADD_FAILURE() << "run " << run << " did not complete its restart:\n" << all;
    completed += ok ? 1 : 0;
  }
  return completed;
}

TEST(DdprunPython, Torch2RestartsFormTheGroupAgainEveryTime) {
  REQUIRE_ROOT();
  const int completed = completed_restarts(20, torch2_env());
  std::printf("torch 2.6 workers: %d of 20 restarts completed\n", completed);
  EXPECT_EQ(completed, 20);
}

TEST(DdprunPython, Torch113RestartsFormTheGroupAgainEveryTime) {
  REQUIRE_TORCH113();
  const int completed = completed_restarts(5, torch113_env());
  std::printf("torch 1.13 workers: %d of 5 restarts completed\n", completed);
  EXPECT_EQ(completed, 5);
}

// TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1: worker rank 0 serves each round's store, as under
// torchrun, and the workers are told so (TORCHELASTIC_USE_AGENT_STORE=False).
TEST(DdprunPython, WorkerHostedStoresRestartWithEitherTorch) {
  REQUIRE_ROOT();
  REQUIRE_TORCH113();
  for (auto env : {torch2_env(), torch113_env()}) {
    env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1";
    EXPECT_EQ(completed_restarts(3, env), 3) << env.at("PYTHON_EXEC");
  }
}

// A --nnodes 1:2 job of Python workers grows from one node to two, then shrinks back when the
// second node's agent is stopped (SIGTERM, as when its pod is deleted): each round forms the
// group at its size, no restart is used, and the job finishes with code 0.
void grow_and_shrink(const std::map<std::string, std::string>& env) {
  const int port = ddp::testing::free_tcp_port();
  char dir_template[] = "/tmp/ddprun-elastic-XXXXXX";
  const std::string dir = mkdtemp(dir_template);
  const std::string stop_file = dir + "/stop";
  auto argv = c10d_flags(port, "1:2", "elastic");
  argv.insert(argv.end(), {"--max-restarts", "0", kElasticScript, stop_file});
  ChildProcess first(argv, env);
  ASSERT_TRUE(first.wait_for_output("round=0 world=1 ok", seconds(120))) << first.output();
  {
    ChildProcess second(argv, env);
    EXPECT_TRUE(first.wait_for_output("round=1 world=2 ok", seconds(120))) << first.output();
    EXPECT_TRUE(second.wait_for_output("round=1 world=2 ok", seconds(30))) << second.output();
    second.signal(SIGTERM);
    EXPECT_NE(second.wait(seconds(60)), 0) << second.output();
  }
  EXPECT_TRUE(first.wait_for_output("round=2 world=1 ok", seconds(120))) << first.output();
  std::ofstream(stop_file) << "stop\n";
  EXPECT_EQ(first.wait(seconds(60)), 0) << first.output();
  EXPECT_NE(first.output().find("round=2 finished"), std::string::npos) << first.output();
  EXPECT_EQ(count_of(first.output(), "restarting the group"), 0) << first.output();
  std::filesystem::remove_all(dir);
}

TEST(DdprunPython, Torch2ElasticJobGrowsAndShrinks) {
  REQUIRE_ROOT();
  grow_and_shrink(torch2_env());
}

TEST(DdprunPython, Torch113ElasticJobGrowsAndShrinks) {
  REQUIRE_TORCH113();
  grow_and_shrink(torch113_env());
}

}  // namespace
}  // namespace ddprun::testing
