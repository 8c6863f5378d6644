// ddprun's --rdzv-backend etcd-v2 against a real etcd (Debian's etcd-server) the test starts:
// join, the workers' store served by each round's node 0, failure propagation, growth, shrink
// (node 0 leaving, so that the workers' store moves), and a silent node 0 declared lost by the
// other node, which watches the heartbeats in etcd as every agent does.
#include <gtest/gtest.h>
#include <unistd.h>

#include <csignal>
#include <optional>
#include <string>
#include <vector>

#include "child_process.h"
#include "ddp/exit_codes.h"
#include "etcd_server.h"
#include "multiprocess.h"

namespace ddprun::testing {
namespace {

using std::chrono::seconds;

const std::string kDdprun = DDPRUN_PATH;
const std::string kWorker = WORKER_PATH;

class EtcdRendezvous : public ddp::testing::EtcdSuite {
 protected:
  // Each test is its own job (run id) under the same etcd.
  static std::vector<std::string> cmd(const std::string& run_id, const std::string& nnodes,
                                      std::vector<std::string> extra,
                                      const std::vector<std::string>& program) {
    std::vector<std::string> c = {kDdprun,
                                  "--nnodes",
                                  nnodes,
                                  "--nproc-per-node",
                                  "1",
                                  "--rdzv-backend",
                                  "etcd-v2",
                                  "--rdzv-endpoint",
                                  server_->endpoint(),
                                  "--rdzv-id",
                                  run_id,
                                  "--monitor-interval",
                                  "0.05"};
    c.insert(c.end(), extra.begin(), extra.end());
    c.insert(c.end(), program.begin(), program.end());
    return c;
  }
};

TEST_F(EtcdRendezvous, TwoNodesJoinAndTheirWorkersMeetAtNodeZerosStore) {
  const std::vector<std::string> worker = {kWorker, "--iterations", "3", "--print-env"};
  ChildProcess a(cmd("join", "2", {}, worker), {});
  ChildProcess b(cmd("join", "2", {}, worker), {});
  ASSERT_EQ(a.wait(seconds(90)), 0) << a.output();
  ASSERT_EQ(b.wait(seconds(30)), 0) << b.output();
  const std::string both = a.output() + b.output();
  EXPECT_EQ(count_of(both, "etcd-v2 rendezvous at " + server_->endpoint()), 2) << both;
  EXPECT_EQ(count_of(both, "sum=3 ok"), 2) << both;
  EXPECT_EQ(count_of(both, "GROUP_RANK=0"), 1) << both;
  EXPECT_EQ(count_of(both, "GROUP_RANK=1"), 1) << both;
  // One agent serves the workers' store; both workers have it, not etcd, as their master.
  EXPECT_EQ(count_of(both, "serving the workers' store on port "), 1) << both;
  EXPECT_EQ(count_of(both, "MASTER_PORT=" + server_->endpoint().substr(10)), 0) << both;
  EXPECT_EQ(count_of(both, "TORCHELASTIC_USE_AGENT_STORE=True"), 2) << both;
}

TEST_F(EtcdRendezvous, AWorkerFailureStopsEveryNodeWithItsCode) {
  const std::vector<std::string> worker = {kWorker, "--iterations", "100000", "--interval-ms",
                                           "20",    "--fail-rank",  "1",      "--exit-code",
                                           "3"};
  ChildProcess a(cmd("fail", "2", {}, worker), {});
  ChildProcess b(cmd("fail", "2", {}, worker), {});
  EXPECT_EQ(a.wait(seconds(90)), 3) << a.output();
  EXPECT_EQ(b.wait(seconds(30)), 3) << b.output();
  EXPECT_EQ(count_of(a.output() + b.output(),
                     "root cause (first failure): rank 1 (local rank 0) on node 1"),
            2)
      << a.output() << b.output();
}

TEST_F(EtcdRendezvous, ElasticJobGrowsWhenANodeArrives) {
  const std::vector<std::string> worker = {kWorker, "--iterations", "150", "--interval-ms", "20"};
  const std::vector<std::string> flags = {"--rdzv-conf", "last_call_timeout=0.5", "--max-restarts",
                                          "0"};
  ChildProcess first(cmd("grow", "1:2", flags, worker), {});
  ASSERT_TRUE(first.wait_for_output("first_allreduce", seconds(90))) << first.output();
  ChildProcess second(cmd("grow", "1:2", flags, worker), {});
  ASSERT_EQ(first.wait(seconds(120)), 0) << first.output();
  ASSERT_EQ(second.wait(seconds(30)), 0) << second.output();
  EXPECT_NE(first.output().find("round 0: node 0 of 1, ranks 0..0 of 1"), std::string::npos)
      << first.output();
  EXPECT_NE(first.output().find("1 node waiting to join the 1 running"), std::string::npos)
      << first.output();
  const std::string both = first.output() + second.output();
  EXPECT_EQ(count_of(both, " of 2, ranks "), 2) << both;
  EXPECT_EQ(count_of(both, "sum=3 ok attempt=1"), 2) << both;
  EXPECT_EQ(count_of(both, "restarting the group"), 0) << both;
}

TEST_F(EtcdRendezvous, ElasticJobGoesOnWhenNodeZeroLeavesAndTheWorkersStoreMoves) {
  // With c10d the store's host cannot leave; with etcd any node can, node 0 included: the one
  // left becomes node 0 of the next round and serves its workers' store itself.
  const std::vector<std::string> worker = {kWorker, "--iterations", "150", "--interval-ms", "20"};
  const std::vector<std::string> flags = {"--rdzv-conf", "last_call_timeout=0.5", "--max-restarts",
                                          "0"};
  ChildProcess a(cmd("shrink", "1:2", flags, worker), {});
  ChildProcess b(cmd("shrink", "1:2", flags, worker), {});
  ASSERT_TRUE(a.wait_for_output("first_allreduce", seconds(90))) << a.output();
  ASSERT_TRUE(b.wait_for_output("first_allreduce", seconds(30))) << b.output();
  const bool a_is_zero = a.output().find("round 0: node 0 of 2") != std::string::npos;
  ChildProcess& leaving = a_is_zero ? a : b;
  ChildProcess& staying = a_is_zero ? b : a;
  ASSERT_NE(staying.output().find("round 0: node 1 of 2"), std::string::npos) << staying.output();
  leaving.signal(SIGTERM);
  EXPECT_NE(leaving.wait(seconds(30)), 0) << leaving.output();
  ASSERT_EQ(staying.wait(seconds(120)), 0) << staying.output();
  EXPECT_NE(staying.output().find("round 1: node 0 of 1, ranks 0..0 of 1"), std::string::npos)
      << staying.output();
  EXPECT_NE(staying.output().find("serving the workers' store on port "), std::string::npos)
      << staying.output();
  EXPECT_NE(staying.output().find("sum=1 ok attempt=1"), std::string::npos) << staying.output();
}

TEST_F(EtcdRendezvous, ASilentNodeZeroIsDeclaredLostByTheOtherNode) {
  // Node 0's agent and worker stop without closing a socket. No node hosts the rendezvous, so
  // node 1 reads the heartbeats in etcd itself and names node 0 within the limit.
  const std::vector<std::string> worker = {kWorker, "--iterations", "100000", "--interval-ms",
                                           "20"};
  const std::vector<std::string> flags = {"--rdzv-conf",
                                          "keep_alive_interval=0.3,keep_alive_max_attempt=3"};
  ChildProcess a(cmd("silent", "2", flags, worker), {{"DDP_TIMEOUT_SEC", "600"}});
  ChildProcess b(cmd("silent", "2", flags, worker), {{"DDP_TIMEOUT_SEC", "600"}});
  ASSERT_TRUE(a.wait_for_output("first_allreduce", seconds(90))) << a.output();
  ASSERT_TRUE(b.wait_for_output("first_allreduce", seconds(30))) << b.output();
  const bool a_is_zero = a.output().find("round 0: node 0 of 2") != std::string::npos;
  ChildProcess& silent = a_is_zero ? a : b;
  ChildProcess& other = a_is_zero ? b : a;
  std::optional<int> code;
  const auto start = std::chrono::steady_clock::now();
  {
    SilentNode stopped(silent);
    ASSERT_TRUE(stopped.ok());
    code = other.wait(seconds(60));
  }
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(code, ddp::exit_code::kComm) << other.output();
  EXPECT_LT(took, seconds(20)) << other.output();
  EXPECT_NE(other.output().find("root cause (first failure): node 0 ("), std::string::npos)
      << other.output();
  EXPECT_NE(other.output().find("was lost: no heartbeat for 0.9 s"), std::string::npos)
      << other.output();
  EXPECT_NE(other.output().find("aborted by ddprun: node 0 ("), std::string::npos)
      << other.output();
  EXPECT_TRUE(wait_all_dead(printed_pids(other.output()), seconds(10)));
}

TEST_F(EtcdRendezvous, AnUnreachableEtcdFailsWithinTheJoinTimeoutNamingIt) {
  const int port = ddp::testing::free_tcp_port();
  ChildProcess a({kDdprun, "--nnodes", "2", "--rdzv-backend", "etcd-v2", "--rdzv-endpoint",
                  "127.0.0.1:" + std::to_string(port), "--rdzv-conf", "join_timeout=2", kWorker},
                 {});
  EXPECT_EQ(a.wait(seconds(30)), ddp::exit_code::kRendezvous) << a.output();
  EXPECT_NE(a.output().find("cannot reach etcd at 127.0.0.1:" + std::to_string(port)),
            std::string::npos)
      << a.output();
  EXPECT_NE(a.output().find("check that etcd runs there"), std::string::npos) << a.output();
  // Said once, with the cause alone inside: not the store client's whole sentence again.
  EXPECT_EQ(count_of(a.output(), "cannot reach etcd at"), 1) << a.output();
}

}  // namespace
}  // namespace ddprun::testing
