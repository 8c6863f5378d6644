// An unchanged Python torch.distributed script (Debian's python3-torch, env:// init, gloo) runs
// under ddprun across two agents (nodes) on loopback with two workers each.
#include <gtest/gtest.h>

#include <cstdlib>

#include "child_process.h"
#include "multiprocess.h"

namespace ddprun::testing {
namespace {

using std::chrono::seconds;

TEST(DdprunPython, GlooAllreduceAcrossTwoNodesOfTwoWorkers) {
  if (std::system("/usr/bin/python3 -c 'import torch.distributed' >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "/usr/bin/python3 cannot import torch.distributed; install python3-torch "
                    "(scripts/install-deps) to run this test";
  }
  const int port = ddp::testing::free_tcp_port();
  const std::string script = std::string(TEST_SOURCE_DIR) + "/gloo_allreduce.py";
  const std::map<std::string, std::string> env = {{"PYTHON_EXEC", "/usr/bin/python3"},
                                                  {"GLOO_SOCKET_IFNAME", "lo"}};
  const auto node = [&](int rank) {
    return std::vector<std::string>{DDPRUN_PATH,
                                    "--nnodes",
                                    "2",
                                    "--node_rank",
                                    std::to_string(rank),
                                    "--nproc_per_node",
                                    "2",
                                    "--master_addr",
                                    "127.0.0.1",
                                    "--master_port",
                                    std::to_string(port),
                                    script};
  };
  ChildProcess node0(node(0), env);
  ChildProcess node1(node(1), env);
  ASSERT_EQ(node0.wait(seconds(300)), 0) << node0.output();
  ASSERT_EQ(node1.wait(seconds(60)), 0) << node1.output();
  const std::string both = node0.output() + node1.output();
  for (int r = 0; r < 4; ++r) {
    const std::string line = "[rank" + std::to_string(r) + "]:python rank=" + std::to_string(r) +
                             " world=4 sum=10.0 expected=10.0";
    EXPECT_NE(both.find(line), std::string::npos) << line << "\n" << both;
  }
}

}  // namespace
}  // namespace ddprun::testing
