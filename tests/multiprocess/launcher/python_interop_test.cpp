// An unchanged Python torch.distributed script (env:// init, gloo) runs under ddprun: with
// Debian's python3-torch 1.13 across two agents (nodes) on loopback with two workers each, and
// with PyTorch 2.6 (the trixie root of tests/interop/prepare-torch2-root, the ctest fixture
// interop.torch2_root) as workers of this ddprun, one node and two, and with ddprun itself
// copied into that root, as a user copies it into their own PyTorch image.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>

#include "child_process.h"
#include "multiprocess.h"

namespace ddprun::testing {
namespace {

using std::chrono::seconds;

const std::string kScript = std::string(TEST_SOURCE_DIR) + "/gloo_allreduce.py";
const std::string kTorch2Python = std::string(INTEROP_DIR) + "/torch2-python";

// `nodes` agents of two workers each on loopback; each agent's argv is `prefix`, `ddprun` (if
// any) and ddprun's arguments.
void run_job(int nodes, const std::vector<std::string>& prefix, const std::string& ddprun,
             const std::map<std::string, std::string>& env, const std::string& expect_version) {
  const int port = ddp::testing::free_tcp_port();
  std::vector<std::unique_ptr<ChildProcess>> agents;
  for (int n = 0; n < nodes; ++n) {
    std::vector<std::string> argv = prefix;
    if (!ddprun.empty()) argv.push_back(ddprun);
    for (const std::string& a :
         {std::string("--nnodes"), std::to_string(nodes), std::string("--node_rank"),
          std::to_string(n), std::string("--nproc_per_node"), std::string("2"),
          std::string("--master_addr"), std::string("127.0.0.1"), std::string("--master_port"),
          std::to_string(port), kScript}) {
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

}  // namespace
}  // namespace ddprun::testing
