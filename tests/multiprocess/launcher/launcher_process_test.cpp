// Drives the real ddprun binary: single node, two nodes on loopback, faults and signals.
// Every test has hard deadlines and kills what it started (see child_process.h).
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <regex>
#include <sstream>
#include <thread>

#include "../../launcher/metrics/http_get.h"
#include "child_process.h"
#include "ddp/exit_codes.h"
#include "multiprocess.h"

namespace ddprun::testing {
namespace {

using std::chrono::seconds;

const std::string kDdprun = DDPRUN_PATH;
const std::string kWorker = WORKER_PATH;
const std::string kSourceDir = TEST_SOURCE_DIR;

std::vector<std::string> cmd(std::vector<std::string> flags, std::vector<std::string> program) {
  flags.insert(flags.begin(), kDdprun);
  flags.insert(flags.end(), program.begin(), program.end());
  return flags;
}

std::vector<std::string> node_flags(int node, int port, int nproc = 2) {
  return {"--nnodes",           "2",
          "--node-rank",        std::to_string(node),
          "--nproc-per-node",   std::to_string(nproc),
          "--master-addr",      "127.0.0.1",
          "--master-port",      std::to_string(port),
          "--monitor-interval", "0.05"};
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// Whether `text` holds `line` as a whole line: a worker's line as it wrote it (a stream not tee'd
// reaches the console unchanged, as under torchrun).
bool has_line(const std::string& text, const std::string& line) {
  const auto lines = lines_of(text);
  return std::find(lines.begin(), lines.end(), line) != lines.end();
}

// Whether `text` holds, as a whole line after `prefix`, the line the test worker logs to stderr
// once it joined: "[hh:mm:ss.mmm] [rankN] [info] joined as rank N/...".
bool has_joined_line(const std::string& text, const std::string& prefix, int rank) {
  const std::string r = std::to_string(rank);
  const std::regex joined("\\[[0-9:.]+\\] \\[rank" + r + "\\] \\[info\\] joined as rank " + r +
                          "/.*");
  for (const auto& line : lines_of(text)) {
    if (line.compare(0, prefix.size(), prefix) == 0 &&
        std::regex_match(line.substr(prefix.size()), joined)) {
      return true;
    }
  }
  return false;
}

// --tee 3 with TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE='[rank${rank}]:': each worker line names
// its global rank, for the tests of several nodes.
std::vector<std::string> tee_flags(std::vector<std::string> flags) {
  flags.insert(flags.end(), {"--tee", "3"});
  return flags;
}
const std::map<std::string, std::string> kRankPrefix = {
    {"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", "[rank${rank}]:"}};

struct TempDir {
  std::string path;
  TempDir() {
    char p[] = "/tmp/ddprun-test-dir-XXXXXX";
    path = mkdtemp(p);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
};

// torchrun 2.6's console: a stream not tee'd reaches it as the worker wrote it (the workers
// inherit torchrun's console), a tee'd one prefixed "[<role><local rank>]:" or by
// TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE, and one redirected without --tee not at all.
TEST(DdprunProcess, ConsoleLinesAreBareUnlessTeedAsUnderTorchrun) {
  const std::map<std::string, std::string> templated = {
      {"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", "[${role_name}${local_rank}|$rank $host]:"}};
  ChildProcess bare(cmd({"--standalone", "--nproc-per-node", "2", "--role", "trainer"}, {kWorker}),
                    templated);  // the template names tee'd lines only
  ASSERT_EQ(bare.wait(seconds(60)), 0) << bare.output();
  std::string out = bare.output();
  EXPECT_TRUE(has_line(out, "rank=0 sum=3 ok attempt=0")) << out;
  EXPECT_TRUE(has_line(out, "rank=1 sum=3 ok attempt=0")) << out;
  EXPECT_TRUE(has_joined_line(out, "", 1)) << out;
  EXPECT_EQ(out.find("]:"), std::string::npos) << out;

  ChildProcess teed(cmd({"--standalone", "--nproc-per-node", "2", "--tee", "3"}, {kWorker}), {});
  ASSERT_EQ(teed.wait(seconds(60)), 0) << teed.output();
  out = teed.output();
  EXPECT_TRUE(has_line(out, "[default0]:rank=0 sum=3 ok attempt=0")) << out;
  EXPECT_TRUE(has_line(out, "[default1]:rank=1 sum=3 ok attempt=0")) << out;
  EXPECT_TRUE(has_joined_line(out, "[default1]:", 1)) << out;  // stderr too
  EXPECT_FALSE(has_joined_line(out, "", 1)) << out;
  EXPECT_FALSE(has_line(out, "rank=0 sum=3 ok attempt=0")) << out;

  ChildProcess named(
      cmd({"--standalone", "--nproc-per-node", "2", "--role", "trainer", "--tee", "1"}, {kWorker}),
      templated);
  ASSERT_EQ(named.wait(seconds(60)), 0) << named.output();
  out = named.output();
  // safe_substitute: role, local rank and global rank filled in, the unknown $host kept.
  EXPECT_TRUE(has_line(out, "[trainer0|0 $host]:rank=0 sum=3 ok attempt=0")) << out;
  EXPECT_TRUE(has_line(out, "[trainer1|1 $host]:rank=1 sum=3 ok attempt=0")) << out;
  EXPECT_EQ(out.find("$host]:["), std::string::npos) << "stderr is not tee'd: " << out;

  // --redirects 1 without --tee: stdout to the files only; stderr, neither, as written.
  TempDir dir;
  ChildProcess redirected(
      cmd({"--standalone", "--nproc-per-node", "2", "--log-dir", dir.path, "--redirects", "1"},
          {kWorker}),
      {});
  ASSERT_EQ(redirected.wait(seconds(60)), 0) << redirected.output();
  out = redirected.output();
  EXPECT_EQ(out.find("sum=3 ok"), std::string::npos) << out;
  EXPECT_EQ(out.find("worker rank="), std::string::npos) << out;
  EXPECT_TRUE(has_joined_line(out, "", 1)) << out;
  EXPECT_EQ(out.find("]:"), std::string::npos) << out;
  std::string root;
  for (const auto& entry : std::filesystem::directory_iterator(dir.path)) root = entry.path();
  EXPECT_TRUE(has_line(read_file(root + "/attempt_0/1/stdout.log"), "rank=1 sum=3 ok attempt=0"));
}

TEST(DdprunProcess, StandaloneRunsTwoRanksWithTorchrunEnvironment) {
  ChildProcess run(cmd({"--standalone", "--nproc-per-node", "2"}, {kWorker, "--print-env"}),
                   {{"OMP_NUM_THREADS", ""}});
  ASSERT_EQ(run.wait(seconds(60)), 0) << run.output();
  const std::string out = run.output();
  EXPECT_TRUE(has_line(out, "rank=0 sum=3 ok attempt=0")) << out;
  EXPECT_TRUE(has_line(out, "rank=1 sum=3 ok attempt=0")) << out;
  for (const char* line :
       {"env rank=1 RANK=1", "env rank=1 LOCAL_RANK=1", "env rank=1 WORLD_SIZE=2",
        "env rank=1 LOCAL_WORLD_SIZE=2", "env rank=1 GROUP_RANK=0", "env rank=1 GROUP_WORLD_SIZE=1",
        "env rank=1 ROLE_RANK=1", "env rank=1 ROLE_WORLD_SIZE=2", "env rank=1 ROLE_NAME=default",
        "env rank=1 MASTER_ADDR=127.0.0.1", "env rank=1 TORCHELASTIC_RESTART_COUNT=0",
        "env rank=1 TORCHELASTIC_MAX_RESTARTS=0", "env rank=1 TORCHELASTIC_USE_AGENT_STORE=True",
        "env rank=1 OMP_NUM_THREADS=1"}) {
    EXPECT_TRUE(has_line(out, line)) << line << "\n" << out;
  }
  EXPECT_NE(out.find("\nenv rank=0 TORCHELASTIC_ERROR_FILE=/"), std::string::npos) << out;
}

// Every setting with its value and source; a malformed one is a one-line error and the
// configuration exit code, before any worker would start.
TEST(DdprunProcess, PrintSettingsShowsEveryValueAndItsSource) {
  ChildProcess ok(cmd({"--print-settings"}, {}), {{"DDP_ALGORITHM", "ring"},
                                                  {"DDP_SOCKET_IFNAME", ""},
                                                  {"GLOO_SOCKET_IFNAME", "lo"},
                                                  {"DDP_CHUNK_BYTES", ""}});
  ASSERT_EQ(ok.wait(seconds(30)), 0) << ok.output();
  const std::string out = ok.output();
  // One line per setting: its name padded to the longest name's width, its value and source.
  for (const char* line : {"\nDDP_ALGORITHM +ring  \\(environment\\)\n",
                           "\nDDP_SOCKET_IFNAME +lo  \\(GLOO_SOCKET_IFNAME\\)\n",
                           "\nDDP_TIMEOUT_SEC +1800  \\(default\\)\n",
                           "\nDDP_CHUNK_BYTES +per transport .*\\(default\\)\n"}) {
    EXPECT_TRUE(std::regex_search(out, std::regex(line))) << line << "\n" << out;
  }

  ChildProcess bad(cmd({"--print-settings"}, {}), {{"DDP_ALGORITHM", "halving"}});
  EXPECT_EQ(bad.wait(seconds(30)), ddp::exit_code::kConfig) << bad.output();
  EXPECT_NE(bad.output().find("DDP_ALGORITHM='halving' is not known; use auto, direct, ring or "
                              "recursive_doubling"),
            std::string::npos)
      << bad.output();

  // A launch with a replaced name stops before starting anything.
  ChildProcess launch(cmd({"--standalone", "--nproc-per-node", "1", "--tee", "3"}, {kWorker}),
                      {{"DDP_REDUCE_ISA", "avx2"}});
  EXPECT_EQ(launch.wait(seconds(30)), ddp::exit_code::kConfig) << launch.output();
  EXPECT_NE(launch.output().find("DDP_REDUCE_ISA is no longer read; use DDP_ISA"),
            std::string::npos)
      << launch.output();
  EXPECT_EQ(launch.output().find("[default0]:"), std::string::npos) << launch.output();
}

TEST(DdprunProcess, TwoAgentsOnLoopbackFormOneGroup) {
  const int port = ddp::testing::free_tcp_port();
  ChildProcess node1(cmd(tee_flags(node_flags(1, port)), {kWorker, "--print-env"}), kRankPrefix);
  ChildProcess node0(cmd(tee_flags(node_flags(0, port)), {kWorker, "--print-env"}), kRankPrefix);
  ASSERT_EQ(node0.wait(seconds(90)), 0) << node0.output();
  ASSERT_EQ(node1.wait(seconds(30)), 0) << node1.output();
  const std::string out0 = node0.output();
  const std::string out1 = node1.output();
  for (int r : {0, 1}) {
    EXPECT_NE(out0.find("[rank" + std::to_string(r) + "]:rank=" + std::to_string(r) + " sum=10 ok"),
              std::string::npos)
        << out0;
  }
  for (int r : {2, 3}) {
    EXPECT_NE(out1.find("[rank" + std::to_string(r) + "]:rank=" + std::to_string(r) + " sum=10 ok"),
              std::string::npos)
        << out1;
  }
  EXPECT_NE(out1.find("[rank3]:env rank=3 GROUP_RANK=1"), std::string::npos) << out1;
  EXPECT_NE(out1.find("[rank3]:env rank=3 LOCAL_RANK=1"), std::string::npos) << out1;
  EXPECT_NE(out1.find("[rank3]:env rank=3 WORLD_SIZE=4"), std::string::npos) << out1;
  EXPECT_NE(out1.find("MASTER_PORT=" + std::to_string(port)), std::string::npos) << out1;
}

// ddprun doctor on one host: two agents of two ranks each (named "node N", their hostnames
// being one), the one ring link measured, and the allreduce sweep run over each backend.
TEST(DdprunProcess, DoctorOnLoopbackMeasuresTheLinkAndSweepsEachBackend) {
  for (const char* backend : {"gloo", "fabric"}) {
    SCOPED_TRACE(backend);
    const std::map<std::string, std::string> env{
        {"DDP_BACKEND", backend}, {"DDP_DOCTOR_TRANSFER_MS", "200"}, {"DDP_DOCTOR_SHM_BYTES", "1"}};
    const int port = ddp::testing::free_tcp_port();
    auto flags1 = node_flags(1, port);
    flags1.insert(flags1.begin(), "doctor");  // `ddprun doctor [OPTION...]` works too
    ChildProcess node1(cmd(flags1, {}), env);
    ChildProcess node0(cmd(node_flags(0, port), {"doctor", kWorker}), env);
    ASSERT_EQ(node0.wait(seconds(120)), 0) << node0.output();
    ASSERT_EQ(node1.wait(seconds(30)), 0) << node1.output();
    const std::string out = node0.output();
    EXPECT_NE(out.find(std::string("ddprun doctor: 2 nodes x 2 ranks, backend ") + backend),
              std::string::npos)
        << out;
    EXPECT_TRUE(std::regex_search(out, std::regex("node 0 -> node 1 +[0-9.]+ +[0-9.]+ +[0-9.]+\n")))
        << out;
    EXPECT_TRUE(std::regex_search(
        out, std::regex("allreduce busbw \\(Gb/s\\): 4 KiB [0-9.]+; 64 KiB [0-9.]+; 1 MiB [0-9.]+; "
                        "16 MiB [0-9.]+\n")))
        << out;
    EXPECT_NE(out.find("verdict: healthy (2 nodes)"), std::string::npos) << out;
    EXPECT_EQ(out.find("worker rank="), std::string::npos) << "the program ran: " << out;
  }
}

// Two nodes have one link, which only DDP_DOCTOR_MIN_MBPS can judge: 1 Tbit/s is more than
// loopback carries, so both ends are bad (78).
TEST(DdprunProcess, DoctorJudgesTwoNodesAgainstTheFloor) {
  const std::map<std::string, std::string> env{{"DDP_DOCTOR_TRANSFER_MS", "100"},
                                               {"DDP_DOCTOR_SHM_BYTES", "1"},
                                               {"DDP_DOCTOR_MIN_MBPS", "1000000"}};
  const int port = ddp::testing::free_tcp_port();
  ChildProcess node1(cmd(node_flags(1, port, 1), {"doctor"}), env);
  ChildProcess node0(cmd(node_flags(0, port, 1), {"doctor"}), env);
  EXPECT_EQ(node0.wait(seconds(120)), ddp::exit_code::kNodeBad) << node0.output();
  EXPECT_EQ(node1.wait(seconds(30)), ddp::exit_code::kNodeBad) << node1.output();
  EXPECT_TRUE(std::regex_search(
      node1.output(), std::regex("this node \\(node 1\\) is bad: node 0 <-> node 1: [0-9.]+ Gb/s, "
                                 "below DDP_DOCTOR_MIN_MBPS \\(1000.00 Gb/s\\); exit 78")))
      << node1.output();

  ChildProcess both(cmd({"--standalone", "--preflight"}, {"doctor"}), {});
  EXPECT_EQ(both.wait(seconds(30)), ddp::exit_code::kConfig) << both.output();
  EXPECT_NE(both.output().find("drop one of them"), std::string::npos) << both.output();
}

TEST(DdprunProcess, C10dRendezvousAssignsNodesByJoinOrder) {
  const int port = ddp::testing::free_tcp_port();
  const std::vector<std::string> flags = {
      "--nnodes",       "2",    "--nproc-per-node", "1",
      "--rdzv-backend", "c10d", "--rdzv-endpoint",  "127.0.0.1:" + std::to_string(port),
      "--rdzv-id",      "j"};
  ChildProcess a(cmd(flags, {kWorker, "--print-env"}), {});
  ChildProcess b(cmd(flags, {kWorker, "--print-env"}), {});
  ASSERT_EQ(a.wait(seconds(90)), 0) << a.output();
  ASSERT_EQ(b.wait(seconds(30)), 0) << b.output();
  const std::string both = a.output() + b.output();
  EXPECT_EQ(count_of(both, "sum=3 ok"), 2) << both;
  EXPECT_EQ(count_of(both, "GROUP_RANK=0"), 1) << both;
  EXPECT_EQ(count_of(both, "GROUP_RANK=1"), 1) << both;
  EXPECT_EQ(count_of(both, "TORCHELASTIC_RUN_ID=j"), 2) << both;
}

// Two agents on the store's machine find its port held (here a bound socket that never
// listens; in CI once, an agent whose own first connection failed): neither can serve, both
// wait. Once the port is free, one of them serves the store after all and the job runs,
// instead of both waiting out the join timeout.
TEST(DdprunProcess, AnAgentThatMayHostServesTheStoreOnceItsPortIsFree) {
  const int port = ddp::testing::free_tcp_port();
  const int holder = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(holder, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  ASSERT_EQ(bind(holder, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  const std::vector<std::string> flags = {
      "--nnodes",       "2",    "--nproc-per-node", "1",
      "--rdzv-backend", "c10d", "--rdzv-endpoint",  "127.0.0.1:" + std::to_string(port),
      "--rdzv-id",      "late"};
  ChildProcess a(cmd(flags, {kWorker}), {});
  ChildProcess b(cmd(flags, {kWorker}), {});
  ASSERT_TRUE(a.wait_for_output("the store's port is taken here", seconds(30))) << a.output();
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  close(holder);
  ASSERT_EQ(a.wait(seconds(60)), 0) << a.output();
  ASSERT_EQ(b.wait(seconds(30)), 0) << b.output();
  const std::string both = a.output() + b.output();
  EXPECT_EQ(count_of(both, "sum=3 ok"), 2) << both;
  EXPECT_EQ(count_of(both, "serving the rendezvous store on port"), 1) << both;
}

TEST(DdprunProcess, ElasticRangeStartsWithTheMinimumAfterTheLastCall) {
  const int port = ddp::testing::free_tcp_port();
  ChildProcess run(
      cmd({"--nnodes", "1:2", "--nproc-per-node", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint",
           "127.0.0.1:" + std::to_string(port), "--rdzv-conf", "last_call_timeout=0.5"},
          {kWorker}),
      {});
  ASSERT_EQ(run.wait(seconds(60)), 0) << run.output();
  EXPECT_NE(run.output().find("round 0: node 0 of 1, ranks 0..1 of 2"), std::string::npos)
      << run.output();
  EXPECT_EQ(count_of(run.output(), "sum=3 ok"), 2) << run.output();
}

std::vector<std::string> elastic_flags(int port) {
  return {"--nnodes",           "1:2",  "--nproc-per-node", "1",
          "--rdzv-backend",     "c10d", "--rdzv-endpoint",  "127.0.0.1:" + std::to_string(port),
          "--rdzv-id",          "grow", "--rdzv-conf",      "last_call_timeout=0.5",
          "--monitor-interval", "0.05", "--max-restarts",   "0"};
}

TEST(DdprunProcess, ElasticJobGrowsWhenANodeArrivesWithoutUsingARestart) {
  // A MIN:MAX job running below MAX takes in a node that arrives: its agent waits, the running
  // node sees it, stops its workers and both start the next round as two nodes. --max-restarts 0
  // still holds: a membership change is not a failure.
  const int port = ddp::testing::free_tcp_port();
  const std::vector<std::string> worker = {kWorker, "--iterations", "150", "--interval-ms", "20"};
  ChildProcess first(cmd(elastic_flags(port), worker), {});
  ASSERT_TRUE(first.wait_for_output("first_allreduce", seconds(90))) << first.output();
  ChildProcess second(cmd(elastic_flags(port), worker), {});
  ASSERT_EQ(first.wait(seconds(120)), 0) << first.output();
  ASSERT_EQ(second.wait(seconds(30)), 0) << second.output();
  EXPECT_NE(first.output().find("round 0: node 0 of 1, ranks 0..0 of 1"), std::string::npos)
      << first.output();
  EXPECT_NE(second.output().find("waiting for the group to take this node in"), std::string::npos)
      << second.output();
  EXPECT_NE(first.output().find("1 node waiting to join the 1 running"), std::string::npos)
      << first.output();
  EXPECT_NE(first.output().find("round 0 ended for a change of members"), std::string::npos)
      << first.output();
  const std::string both = first.output() + second.output();
  EXPECT_EQ(count_of(both, "round 1: node "), 2) << both;
  EXPECT_EQ(count_of(both, " of 2, ranks "), 2) << both;
  EXPECT_EQ(count_of(both, "sum=3 ok attempt=1"), 2) << both;
  EXPECT_EQ(count_of(both, "restarting the group"), 0) << both;
}

TEST(DdprunProcess, ElasticJobGoesOnWithoutANodeThatWasStopped) {
  // A pod of a MIN:MAX job is deleted (its agent gets SIGTERM): the node leaves, and the other
  // goes on alone after the last call, without using a restart.
  const int port = ddp::testing::free_tcp_port();
  const std::vector<std::string> worker = {kWorker, "--iterations", "150", "--interval-ms", "20"};
  ChildProcess a(cmd(elastic_flags(port), worker), {});
  ChildProcess b(cmd(elastic_flags(port), worker), {});
  ASSERT_TRUE(a.wait_for_output("first_allreduce", seconds(90))) << a.output();
  ASSERT_TRUE(b.wait_for_output("first_allreduce", seconds(30))) << b.output();
  ASSERT_NE(a.output().find(" of 2, ranks "), std::string::npos) << a.output();
  // The agent that bound the endpoint serves the store (the job needs it): the other one leaves.
  const bool a_hosts = a.output().find("serving the rendezvous store on port") != std::string::npos;
  ChildProcess& leaving = a_hosts ? b : a;
  ChildProcess& staying = a_hosts ? a : b;
  leaving.signal(SIGTERM);
  EXPECT_NE(leaving.wait(seconds(30)), 0) << leaving.output();
  ASSERT_EQ(staying.wait(seconds(120)), 0) << staying.output();
  EXPECT_NE(staying.output().find("ended for a change of members"), std::string::npos)
      << staying.output();
  EXPECT_NE(staying.output().find("round 1: node 0 of 1, ranks 0..0 of 1"), std::string::npos)
      << staying.output();
  EXPECT_NE(staying.output().find("sum=1 ok attempt=1"), std::string::npos) << staying.output();
  EXPECT_EQ(count_of(staying.output(), "restarting the group"), 0) << staying.output();
}

TEST(DdprunProcess, SigkilledWorkerStopsEveryNodeWithTheSignalCode) {
  const int port = ddp::testing::free_tcp_port();
  const std::vector<std::string> worker = {kWorker, "--iterations", "100000", "--interval-ms",
                                           "20"};
  ChildProcess node0(cmd(node_flags(0, port), worker), {});
  ChildProcess node1(cmd(node_flags(1, port), worker), {});
  ASSERT_TRUE(node1.wait_for_output("worker rank=3 pid=", seconds(90))) << node1.output();
  ASSERT_TRUE(node1.wait_for_output("worker rank=2 pid=", seconds(30))) << node1.output();
  ASSERT_TRUE(node0.wait_for_output("worker rank=0 pid=", seconds(30))) << node0.output();
  ASSERT_TRUE(node0.wait_for_output("worker rank=1 pid=", seconds(30))) << node0.output();
  const auto pids0 = printed_pids(node0.output());
  const auto pids1 = printed_pids(node1.output());
  ASSERT_EQ(pids1.size(), 2u);
  const pid_t rank3 = printed_pids(node1.output(), "worker rank=3 pid=").at(0);
  ASSERT_EQ(kill(rank3, SIGKILL), 0);

  // Both agents notice (node 1 directly, node 0 through the store) and exit 128 + SIGKILL.
  EXPECT_EQ(node1.wait(seconds(20)), 128 + SIGKILL) << node1.output();
  EXPECT_EQ(node0.wait(seconds(20)), 128 + SIGKILL) << node0.output();
  EXPECT_NE(node1.output().find("root cause (first failure): rank 3 (local rank 1) on node 1"),
            std::string::npos)
      << node1.output();
  EXPECT_NE(node0.output().find("rank 3 (local rank 1) on node 1"), std::string::npos)
      << node0.output();
  EXPECT_NE(node0.output().find("SIGKILL"), std::string::npos) << node0.output();
  std::vector<pid_t> all = pids0;
  all.insert(all.end(), pids1.begin(), pids1.end());
  EXPECT_TRUE(wait_all_dead(all, seconds(10)));
}

// Two nodes of one worker each, beating every 0.3 s with a limit of 3 (0.9 s of silence).
struct HeartbeatPair {
  explicit HeartbeatPair(int port)
      : node0(cmd(flags(0, port), worker()), {{"DDP_TIMEOUT_SEC", "600"}}),
        node1(cmd(flags(1, port), worker()), {{"DDP_TIMEOUT_SEC", "600"}}) {}
  static std::vector<std::string> flags(int node, int port) {
    auto f = node_flags(node, port, 1);
    f.insert(f.end(), {"--rdzv-conf", "keep_alive_interval=0.3,keep_alive_max_attempt=3"});
    return f;
  }
  static std::vector<std::string> worker() {
    return {kWorker, "--iterations", "100000", "--interval-ms", "20"};
  }
  // Once both run, `silent` stops without closing a socket; returns how long `other` took to
  // exit (its code in `code`), at most 60 s.
  std::chrono::steady_clock::duration silence(ChildProcess& silent, ChildProcess& other,
                                              std::optional<int>& code) {
    EXPECT_TRUE(node0.wait_for_output("first_allreduce", seconds(90))) << node0.output();
    EXPECT_TRUE(node1.wait_for_output("first_allreduce", seconds(30))) << node1.output();
    SilentNode stopped(silent);
    EXPECT_TRUE(stopped.ok());
    const auto start = std::chrono::steady_clock::now();
    code = other.wait(seconds(60));
    return std::chrono::steady_clock::now() - start;
  }
  ChildProcess node0;
  ChildProcess node1;
};

TEST(DdprunProcess, ASilentNodeIsDeclaredLostByItsHeartbeatAndNamed) {
  // Node 1's agent and workers stop without closing a socket (SIGSTOP: as a node that loses
  // power or its network). Node 0 must not wait for the collective timeout: node 1's heartbeat
  // stops, node 0 names it as the root cause and exits with 70 within seconds.
  HeartbeatPair pair(ddp::testing::free_tcp_port());
  std::optional<int> code;
  const auto took = pair.silence(pair.node1, pair.node0, code);
  const std::string out = pair.node0.output();
  EXPECT_EQ(code, ddp::exit_code::kComm) << out;
  // 0.9 s of silence, the workers' 2 s to give up, no wait for the lost node's answer.
  EXPECT_LT(took, seconds(20)) << out;
  EXPECT_NE(out.find("root cause (first failure): node 1 ("), std::string::npos) << out;
  EXPECT_NE(out.find("was lost: no heartbeat for 0.9 s"), std::string::npos) << out;
  // Node 0's worker, blocked in a collective with the silent one, is told why and gives up
  // with a CommError naming the lost node (comm/abort_notice.h), before the agent's SIGKILL.
  EXPECT_NE(out.find("aborted by ddprun: node 1 ("), std::string::npos) << out;
  EXPECT_EQ(out.find("sending SIGKILL"), std::string::npos) << out;
  EXPECT_TRUE(wait_all_dead(printed_pids(out), seconds(10)));
}

TEST(DdprunProcess, AStoreHostThatFallsSilentStopsTheOtherNodesWithinTheHeartbeatLimit) {
  // Node 0 serves the rendezvous store; its agent and worker stop without closing a socket.
  // Node 1's next request goes unanswered: it must name node 0's host and exit within the
  // heartbeat limit (0.9 s here), not after read_timeout (60 s) or the collective timeout.
  const int port = ddp::testing::free_tcp_port();
  HeartbeatPair pair(port);
  std::optional<int> code;
  const auto took = pair.silence(pair.node0, pair.node1, code);
  const std::string out = pair.node1.output();
  EXPECT_EQ(code, ddp::exit_code::kRendezvous) << out;
  EXPECT_LT(took, seconds(20)) << out;
  EXPECT_NE(out.find("the rendezvous store's host (127.0.0.1:" + std::to_string(port) +
                     ") did not answer this node within 0.9 s"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("aborted by ddprun: the rendezvous store's host"), std::string::npos) << out;
  EXPECT_TRUE(wait_all_dead(printed_pids(out), seconds(10)));
}

// A node falls silent (SIGSTOP: no socket is closed) while the workers' op timeout
// (DDP_TIMEOUT_SEC) is shorter than, equal to or longer than the default heartbeat limit (5 s x 3):
// whichever fires first, the lost node is the root cause, never the survivor whose collective
// timed out, and the survivor exits within max(op timeout, heartbeat limit) + 5 s.
class SilentNodeUnderOpTimeout : public ::testing::TestWithParam<int> {};

TEST_P(SilentNodeUnderOpTimeout, TheLostNodeIsTheRootCause) {
  const int op_timeout = GetParam();
  const int port = ddp::testing::free_tcp_port();
  const std::map<std::string, std::string> env = {{"DDP_TIMEOUT_SEC", std::to_string(op_timeout)}};
  const std::vector<std::string> worker = {kWorker, "--iterations", "100000", "--interval-ms",
                                           "20"};
  ChildProcess node0(cmd(node_flags(0, port, 1), worker), env);
  ChildProcess node1(cmd(node_flags(1, port, 1), worker), env);
  ASSERT_TRUE(node0.wait_for_output("first_allreduce", seconds(90))) << node0.output();
  ASSERT_TRUE(node1.wait_for_output("first_allreduce", seconds(30))) << node1.output();
  SilentNode stopped(node1);
  ASSERT_TRUE(stopped.ok());
  const auto start = std::chrono::steady_clock::now();
  const auto code = node0.wait(seconds(120));
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const std::string out = node0.output();
  std::printf("DDP_TIMEOUT_SEC=%d: the survivor exited %.1f s after node 1 fell silent\n",
              op_timeout, took);
  EXPECT_EQ(code, ddp::exit_code::kComm) << out;
  EXPECT_LT(took, std::max(op_timeout, 15) + 5) << out;
  EXPECT_NE(out.find("root cause (first failure): node 1 ("), std::string::npos) << out;
  EXPECT_NE(out.find("was lost: no heartbeat for 15.0 s"), std::string::npos) << out;
  EXPECT_TRUE(wait_all_dead(printed_pids(out), seconds(10)));
}

INSTANTIATE_TEST_SUITE_P(OpTimeouts, SilentNodeUnderOpTimeout, ::testing::Values(5, 15, 60));

TEST(DdprunProcess, WorkerExitCodeReachesEveryNodeAndTheErrorFile) {
  const int port = ddp::testing::free_tcp_port();
  TempDir dir;
  const std::vector<std::string> worker = {kWorker, "--iterations", "100000", "--interval-ms",
                                           "20",    "--fail-rank",  "1",      "--exit-code",
                                           "3"};
  auto flags0 = node_flags(0, port, 1);
  flags0.insert(flags0.end(), {"--log-dir", dir.path, "--rdzv-id", "e"});
  auto flags1 = node_flags(1, port, 1);
  flags1.insert(flags1.end(), {"--rdzv-id", "e"});
  ChildProcess node0(cmd(flags0, worker), {{"TORCHELASTIC_ERROR_FILE", dir.path + "/root.json"}});
  ChildProcess node1(cmd(flags1, worker), {});
  EXPECT_EQ(node1.wait(seconds(90)), 3) << node1.output();
  EXPECT_EQ(node0.wait(seconds(30)), 3) << node0.output();
  EXPECT_NE(node1.output().find("failing on purpose with exit code 3"), std::string::npos)
      << node1.output();
  // Node 0 prints the root cause, stderr tail included, though it happened on node 1.
  EXPECT_NE(node0.output().find("rank 1 (local rank 0) on node 1"), std::string::npos)
      << node0.output();
  EXPECT_NE(node0.output().find("rank 1: failing on purpose"), std::string::npos) << node0.output();
  const std::string json = read_file(dir.path + "/root.json");
  EXPECT_NE(json.find("\"errorCode\": 3"), std::string::npos) << json;
  EXPECT_NE(json.find("rank 1 (local rank 0) on node 1"), std::string::npos) << json;
}

TEST(DdprunProcess, MaxRestartsRestartsAllNodesTogether) {
  const int port = ddp::testing::free_tcp_port();
  const std::vector<std::string> worker = {kWorker, "--iterations", "3", "--fail-rank",
                                           "2",     "--exit-code",  "7", "--first-attempt-only"};
  auto flags0 = node_flags(0, port);
  auto flags1 = node_flags(1, port);
  flags0.insert(flags0.end(), {"--max-restarts", "1"});
  flags1.insert(flags1.end(), {"--max-restarts", "1"});
  ChildProcess node0(cmd(flags0, worker), {});
  ChildProcess node1(cmd(flags1, worker), {});
  ASSERT_EQ(node0.wait(seconds(120)), 0) << node0.output();
  ASSERT_EQ(node1.wait(seconds(30)), 0) << node1.output();
  const std::string both = node0.output() + node1.output();
  EXPECT_EQ(count_of(both, "sum=10 ok attempt=1"), 4) << both;
  EXPECT_EQ(count_of(both, "restarting the group: restart 1 of 1"), 2) << both;
}

TEST(DdprunProcess, ReplacementNodeJoinsTheRestartedGroup) {
  // Kubernetes replaces a pod whose agent died: the surviving node restarts the group and the
  // new agent joins the next round under the same node rank.
  const int port = ddp::testing::free_tcp_port();
  const std::vector<std::string> worker = {kWorker, "--iterations", "150", "--interval-ms", "20"};
  auto flags0 = node_flags(0, port, 1);
  auto flags1 = node_flags(1, port, 1);
  for (auto* flags : {&flags0, &flags1}) {
    flags->insert(flags->end(), {"--max-restarts", "1", "--shutdown-timeout", "2", "--tee", "3"});
  }
  ChildProcess node0(cmd(flags0, worker), kRankPrefix);
  auto node1 = std::make_unique<ChildProcess>(cmd(flags1, worker), kRankPrefix);
  ASSERT_TRUE(node1->wait_for_output("first_allreduce", seconds(90))) << node1->output();
  const auto first_workers = printed_pids(node1->output());
  node1->signal(SIGKILL);
  EXPECT_EQ(node1->wait(seconds(10)), 128 + SIGKILL);
  EXPECT_TRUE(wait_all_dead(first_workers, seconds(10)));
  ASSERT_TRUE(node0.wait_for_output("restarting the group: restart 1 of 1", seconds(60)))
      << node0.output();

  ChildProcess replacement(cmd(flags1, worker), kRankPrefix);
  ASSERT_EQ(node0.wait(seconds(120)), 0) << node0.output();
  ASSERT_EQ(replacement.wait(seconds(30)), 0) << replacement.output();
  EXPECT_NE(replacement.output().find("round 1: node 1 of 2"), std::string::npos)
      << replacement.output();
  EXPECT_NE(replacement.output().find("[rank1]:rank=1 sum=3 ok attempt=1"), std::string::npos)
      << replacement.output();
  EXPECT_NE(node0.output().find("[rank0]:rank=0 sum=3 ok attempt=1"), std::string::npos)
      << node0.output();
}

TEST(DdprunProcess, SigtermIsForwardedThenWorkersAreKilledAfterTheTimeout) {
  ChildProcess run(
      cmd({"--standalone", "--nproc-per-node", "2", "--shutdown-timeout", "1", "--tee", "3"},
          {kSourceDir + "/term_trapping_worker.sh"}),
      {});
  ASSERT_TRUE(run.wait_for_output("shell_pid=", seconds(30))) << run.output();
  ASSERT_TRUE(run.wait_for_output("[default1]:shell_pid=", seconds(10))) << run.output();
  ASSERT_TRUE(run.wait_for_output("[default0]:shell_pid=", seconds(10))) << run.output();
  const auto shells = printed_pids(run.output(), "shell_pid=");
  const auto grandchildren = printed_pids(run.output(), "grandchild_pid=");
  ASSERT_EQ(shells.size(), 2u);
  ASSERT_EQ(grandchildren.size(), 2u);

  const auto start = std::chrono::steady_clock::now();
  run.signal(SIGTERM);
  ASSERT_EQ(run.wait(seconds(20)), 128 + SIGTERM) << run.output();
  const auto elapsed = std::chrono::steady_clock::now() - start;
  const std::string out = run.output();
  // The workers saw SIGTERM, ignored it, and were killed only after the 1 s timeout.
  EXPECT_NE(out.find("[default0]:rank 0 got SIGTERM"), std::string::npos) << out;
  EXPECT_NE(out.find("[default1]:rank 1 got SIGTERM"), std::string::npos) << out;
  EXPECT_NE(out.find("sending SIGKILL"), std::string::npos) << out;
  EXPECT_GE(elapsed, std::chrono::milliseconds(900));
  std::vector<pid_t> all = shells;
  all.insert(all.end(), grandchildren.begin(), grandchildren.end());
  EXPECT_TRUE(wait_all_dead(all, seconds(5)));
}

TEST(DdprunProcess, PreemptedNodeReportsItsWorkersAnswerOnEveryNode) {
  const int port = ddp::testing::free_tcp_port();
  const std::vector<std::string> worker = {kSourceDir + "/checkpointing_worker.sh"};
  ChildProcess node0(cmd(tee_flags(node_flags(0, port, 1)), worker), kRankPrefix);
  ChildProcess node1(cmd(tee_flags(node_flags(1, port, 1)), worker), kRankPrefix);
  ASSERT_TRUE(node0.wait_for_output("ready rank=0", seconds(60))) << node0.output();
  ASSERT_TRUE(node1.wait_for_output("ready rank=1", seconds(60))) << node1.output();
  node1.signal(SIGTERM);  // the kubelet stopping node 1's pod
  EXPECT_EQ(node1.wait(seconds(30)), 75) << node1.output();
  EXPECT_EQ(node0.wait(seconds(30)), 75) << node0.output();
  EXPECT_NE(node1.output().find("[rank1]:rank 1 checkpointed"), std::string::npos);
  EXPECT_NE(node0.output().find("[rank0]:rank 0 checkpointed"), std::string::npos);
  EXPECT_NE(node0.output().find("root cause (first failure): ddprun on node 1 ("),
            std::string::npos)
      << node0.output();
  EXPECT_NE(node0.output().find("its workers exited with code 75"), std::string::npos)
      << node0.output();
}

TEST(DdprunProcess, TwoNodesClaimingOneNodeRankBothFailNamingIt) {
  // The round's places are handed out by one agent: a conflict must still reach every node.
  const int port = ddp::testing::free_tcp_port();
  auto flags = [&](bool host) {
    std::vector<std::string> f = {"--nnodes",         "2",
                                  "--nproc-per-node", "1",
                                  "--node-rank",      "1",
                                  "--rdzv-backend",   "c10d",
                                  "--rdzv-endpoint",  "127.0.0.1:" + std::to_string(port)};
    if (host) f.insert(f.end(), {"--rdzv-conf", "is_host=true"});
    return f;
  };
  ChildProcess a(cmd(flags(true), {kWorker}), {});
  ChildProcess b(cmd(flags(false), {kWorker}), {});
  EXPECT_EQ(a.wait(seconds(60)), ddp::exit_code::kConfig) << a.output();
  EXPECT_EQ(b.wait(seconds(30)), ddp::exit_code::kConfig) << b.output();
  for (const ChildProcess* p : {&a, &b}) {
    EXPECT_NE(p->output().find("node rank 1 is claimed by two nodes"), std::string::npos)
        << p->output();
  }
}

TEST(DdprunProcess, WorkersDieWithASigkilledAgent) {
  ChildProcess run(cmd({"--standalone", "--nproc-per-node", "2"},
                       {kWorker, "--iterations", "100000", "--interval-ms", "20"}),
                   {});
  ASSERT_TRUE(run.wait_for_output("worker rank=1 pid=", seconds(60))) << run.output();
  ASSERT_TRUE(run.wait_for_output("worker rank=0 pid=", seconds(10))) << run.output();
  const auto pids = printed_pids(run.output());
  ASSERT_EQ(pids.size(), 2u);
  run.signal(SIGKILL);
  EXPECT_EQ(run.wait(seconds(10)), 128 + SIGKILL);
  EXPECT_TRUE(wait_all_dead(pids, seconds(10)));
}

TEST(DdprunProcess, RunsAsPidOneOfAContainer) {
  // A container's entrypoint is PID 1 of its PID namespace: the kernel drops signals that
  // PID 1 has no handler for, and every orphan of the container becomes its child.
  if (std::system("unshare --pid --fork --mount-proc true >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "cannot create a PID namespace here (needs root and unshare)";
  }
  const std::vector<std::string> pid1 = {"/usr/bin/unshare", "--pid", "--fork", "--mount-proc"};
  auto ok_cmd = pid1;
  for (const auto& a : cmd({"--standalone", "--nproc-per-node", "2"}, {kWorker})) {
    ok_cmd.push_back(a);
  }
  ChildProcess ok(ok_cmd, {});
  ASSERT_EQ(ok.wait(seconds(60)), 0) << ok.output();
  EXPECT_EQ(count_of(ok.output(), "sum=3 ok"), 2) << ok.output();

  // Stopping the container: ddprun (PID 1 inside, unshare's child outside) gets SIGTERM.
  auto term_cmd = pid1;
  for (const auto& a : cmd({"--standalone", "--nproc-per-node", "2", "--shutdown-timeout", "5"},
                           {kWorker, "--iterations", "100000", "--interval-ms", "20"})) {
    term_cmd.push_back(a);
  }
  ChildProcess term(term_cmd, {});
  ASSERT_TRUE(term.wait_for_output("first_allreduce", seconds(60))) << term.output();
  std::ifstream children("/proc/" + std::to_string(term.pid()) + "/task/" +
                         std::to_string(term.pid()) + "/children");
  pid_t ddprun_pid = 0;
  ASSERT_TRUE(children >> ddprun_pid) << "cannot find unshare's child";
  ASSERT_EQ(kill(ddprun_pid, SIGTERM), 0);
  EXPECT_EQ(term.wait(seconds(30)), 128 + SIGTERM) << term.output();
  EXPECT_NE(term.output().find("received SIGTERM: forwarding it to the workers"), std::string::npos)
      << term.output();
}

TEST(DdprunProcess, ConfigErrorsAndRendezvousTimeoutsHaveTheirExitCodes) {
  ChildProcess bad(cmd({"--nnodes", "2", "--node-rank", "2"}, {kWorker}), {});
  EXPECT_EQ(bad.wait(seconds(20)), 64) << bad.output();
  EXPECT_NE(bad.output().find("node rank 2 (from --node-rank)"), std::string::npos) << bad.output();

  ChildProcess missing(cmd({}, {"/nonexistent/trainer"}), {});
  EXPECT_EQ(missing.wait(seconds(20)), 64) << missing.output();
  EXPECT_NE(missing.output().find("/nonexistent/trainer"), std::string::npos);

  const int port = ddp::testing::free_tcp_port();
  ChildProcess alone(cmd({"--nnodes", "2", "--node-rank", "0", "--master-port",
                          std::to_string(port), "--rdzv-conf", "join_timeout=1"},
                         {kWorker}),
                     {});
  EXPECT_EQ(alone.wait(seconds(30)), 69) << alone.output();
  EXPECT_NE(alone.output().find("rendezvous timed out: 1 of 2 nodes"), std::string::npos)
      << alone.output();

  ChildProcess orphan(cmd({"--nnodes", "2", "--node-rank", "1", "--master-addr",
                           "no-such-host.invalid", "--rdzv-conf", "join_timeout=1"},
                          {kWorker}),
                      {});
  EXPECT_EQ(orphan.wait(seconds(30)), 69) << orphan.output();
  EXPECT_NE(orphan.output().find("cannot reach the rendezvous store at no-such-host.invalid"),
            std::string::npos)
      << orphan.output();
}

TEST(DdprunProcess, ACopiedBinaryRunsAloneAndLinksOnlyGlibc) {
  // ddprun needs nothing beside itself: a copy in an empty directory runs a job.
  TempDir dir;
  const std::string lone = dir.path + "/ddprun";
  std::filesystem::copy_file(kDdprun, lone);
  ChildProcess run({lone, "--standalone", "--nproc-per-node", "2", kWorker}, {});
  EXPECT_EQ(run.wait(seconds(60)), 0) << run.output();
  EXPECT_NE(run.output().find("rank=1 sum=3 ok"), std::string::npos) << run.output();
  // Its dynamic dependencies are glibc's own libraries only (not under the sanitizers, whose
  // runtimes are shared libraries).
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
  ChildProcess ldd({"/usr/bin/ldd", lone}, {});
  ASSERT_EQ(ldd.wait(seconds(30)), 0) << ldd.output();
  std::istringstream lines(ldd.output());
  for (std::string line; std::getline(lines, line);) {
    const bool glibc =
        line.find("linux-vdso") != std::string::npos || line.find("libc.so") != std::string::npos ||
        line.find("libm.so") != std::string::npos || line.find("ld-linux") != std::string::npos;
    EXPECT_TRUE(glibc) << "ddprun needs more than glibc: " << line;
  }
#endif
}

TEST(DdprunProcess, AnAgentWithoutTheJoinTokenIsRefusedAndTheJobFinishes) {
  TempDir dir;
  const std::string token = dir.path + "/token";
  const std::string wrong = dir.path + "/wrong";
  std::ofstream(token) << "job-secret\n";
  std::ofstream(wrong) << "not-the-secret\n";
  const int port = ddp::testing::free_tcp_port();
  const auto node = [&](const std::string& rank, const std::vector<std::string>& extra) {
    std::vector<std::string> flags{"--nnodes",         "2",
                                   "--node-rank",      rank,
                                   "--nproc-per-node", "1",
                                   "--master-addr",    "127.0.0.1",
                                   "--master-port",    std::to_string(port)};
    flags.insert(flags.end(), extra.begin(), extra.end());
    return cmd(flags, {kWorker});
  };
  ChildProcess node0(node("0", {"--rdzv-conf", "token_file=" + token}), {});
  // Strays first: no token, then a wrong one (by the environment variable).
  ChildProcess none(node("1", {"--rdzv-conf", "join_timeout=20"}), {});
  EXPECT_EQ(none.wait(seconds(60)), 69) << none.output();
  EXPECT_NE(none.output().find("this job requires a join token"), std::string::npos)
      << none.output();
  ChildProcess bad(node("1", {}), {{"DDPRUN_RDZV_TOKEN_FILE", wrong}});
  EXPECT_EQ(bad.wait(seconds(60)), 69) << bad.output();
  EXPECT_NE(bad.output().find("wrong join token"), std::string::npos) << bad.output();
  // The real node 1 joins, and the job finishes as if nothing happened.
  ChildProcess node1(node("1", {}), {{"DDPRUN_RDZV_TOKEN_FILE", token}});
  EXPECT_EQ(node1.wait(seconds(120)), 0) << node1.output();
  EXPECT_EQ(node0.wait(seconds(60)), 0) << node0.output();
  EXPECT_NE(node0.output().find("refused"), std::string::npos) << node0.output();
  EXPECT_EQ(node0.output().find("job-secret"), std::string::npos) << "the token was logged";
}

TEST(DdprunProcess, TeeRedirectsAndLocalRanksFilter) {
  TempDir dir;
  ChildProcess run(
      cmd({"--standalone", "--nproc-per-node", "2", "--log-dir", dir.path, "--rdzv-id", "ignored",
           "--redirects", "0:1", "--tee", "1:3", "--local-ranks-filter", "0,1"},
          {kWorker}),
      {});
  ASSERT_EQ(run.wait(seconds(60)), 0) << run.output();
  const std::string out = run.output();
  // Rank 0's stdout went to its file only, its stderr to the console as written; rank 1's
  // streams to both, prefixed.
  EXPECT_EQ(out.find("rank=0 sum=3 ok"), std::string::npos) << out;
  EXPECT_TRUE(has_line(out, "[default1]:rank=1 sum=3 ok attempt=0")) << out;
  EXPECT_TRUE(has_joined_line(out, "", 0)) << out;
  EXPECT_TRUE(has_joined_line(out, "[default1]:", 1)) << out;
  EXPECT_EQ(out.find("[default0]:"), std::string::npos) << out;
  std::string root;
  for (const auto& entry : std::filesystem::directory_iterator(dir.path)) root = entry.path();
  EXPECT_NE(read_file(root + "/attempt_0/0/stdout.log").find("rank=0 sum=3 ok"), std::string::npos);
  EXPECT_NE(read_file(root + "/attempt_0/1/stdout.log").find("rank=1 sum=3 ok"), std::string::npos);
  EXPECT_NE(read_file(root + "/attempt_0/1/stderr.log").find("joined as rank 1/2"),
            std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(root + "/attempt_0/0/stderr.log"));

  ChildProcess filtered(
      cmd({"--standalone", "--nproc-per-node", "2", "--local-ranks-filter", "1"}, {kWorker}), {});
  ASSERT_EQ(filtered.wait(seconds(60)), 0) << filtered.output();
  // Not tee'd: rank 1's lines as written; nothing of rank 0.
  EXPECT_TRUE(has_line(filtered.output(), "rank=1 sum=3 ok attempt=0")) << filtered.output();
  EXPECT_EQ(filtered.output().find("rank=0"), std::string::npos) << filtered.output();
  EXPECT_EQ(filtered.output().find("rank 0/2"), std::string::npos) << filtered.output();
}

// torchrun 2.9-2.10's flags: the node's filtered copy of tee'd lines per round, a virtual local
// rank, and the signals the agent handles in the workers' environment.
TEST(DdprunProcess, DuplicateFiltersVirtualLocalRankAndHandledSignals) {
  TempDir dir;
  ChildProcess run(cmd({"--standalone", "--nproc-per-node", "2", "--log-dir", dir.path, "--tee",
                        "1:3", "--duplicate-stdout-filters", "sum=3 ok,LOCAL_RANK=,no,,such",
                        "--duplicate-stderr-filters", "joined as", "--virtual-local-rank",
                        "--signals-to-handle", "SIGTERM,SIGUSR1"},
                       {kWorker, "--print-env"}),
                   {{"CUDA_VISIBLE_DEVICES", ""}});
  ASSERT_EQ(run.wait(seconds(60)), 0) << run.output();
  const std::string out = run.output();
  // Rank 0 is not tee'd (its lines as written); rank 1 is, under its real local rank.
  EXPECT_TRUE(has_line(out, "env rank=0 LOCAL_RANK=0")) << out;
  EXPECT_TRUE(has_line(out, "[default1]:env rank=1 LOCAL_RANK=0")) << out;
  EXPECT_TRUE(has_line(out, "[default1]:env rank=1 CUDA_VISIBLE_DEVICES=1")) << out;
  EXPECT_TRUE(has_line(out, "[default1]:env rank=1 LOCAL_WORLD_SIZE=2")) << out;
  EXPECT_TRUE(has_line(out, "env rank=0 TORCHELASTIC_SIGNALS_TO_HANDLE=SIGTERM,SIGUSR1")) << out;
  std::string root;
  for (const auto& entry : std::filesystem::directory_iterator(dir.path)) root = entry.path();
  // Only rank 1's streams are tee'd, so only its lines are copied; only matching ones.
  const std::string copied = read_file(root + "/attempt_0/filtered_stdout.log");
  EXPECT_TRUE(has_line(copied, "[default1]:rank=1 sum=3 ok attempt=0")) << copied;
  EXPECT_TRUE(has_line(copied, "[default1]:env rank=1 LOCAL_RANK=0")) << copied;
  EXPECT_EQ(copied.find("rank=0"), std::string::npos) << copied;
  EXPECT_EQ(copied.find("WORLD_SIZE"), std::string::npos) << copied;
  const std::string errors = read_file(root + "/attempt_0/filtered_stderr.log");
  EXPECT_NE(errors.find("[default1]:"), std::string::npos) << errors;
  EXPECT_NE(errors.find("joined as rank 1/2"), std::string::npos) << errors;
  EXPECT_EQ(errors.find("rank 0/2"), std::string::npos) << errors;
}

// --event-log-handler file:PATH: torchelastic's events, a rendezvous and then each worker's and
// the agent's result, for a job that succeeds and one whose rank 1 fails.
TEST(DdprunProcess, EventLogRecordsTheRendezvousAndEveryResult) {
  TempDir dir;
  const std::string events = dir.path + "/events.jsonl";
  ChildProcess ok(cmd({"--standalone", "--nproc-per-node", "2", "--rdzv-id", "evjob",
                       "--event-log-handler", "file:" + events},
                      {kWorker}),
                  {});
  ASSERT_EQ(ok.wait(seconds(60)), 0) << ok.output();
  auto lines = lines_of(read_file(events));
  ASSERT_EQ(lines.size(), 4u) << read_file(events);
  EXPECT_EQ(
      lines[0].rfind(R"({"name": "torchelastic.worker.status.RENDEZVOUS", "source": "AGENT")", 0),
      0u)
      << lines[0];
  EXPECT_NE(lines[0].find(R"("run_id": )"), std::string::npos) << lines[0];
  for (int i : {1, 2}) {
    EXPECT_NE(
        lines[i].find(R"("name": "torchelastic.worker.status.SUCCEEDED", "source": "WORKER")"),
        std::string::npos)
        << lines[i];
    EXPECT_NE(lines[i].find(R"("global_rank": )" + std::to_string(i - 1)), std::string::npos)
        << lines[i];
  }
  EXPECT_EQ(
      lines[3].rfind(R"({"name": "torchelastic.worker.status.SUCCEEDED", "source": "AGENT")", 0),
      0u)
      << lines[3];

  std::filesystem::remove(events);
  ChildProcess failed(
      cmd({"--standalone", "--nproc-per-node", "2", "--event-log-handler", "file:" + events},
          // Rank 0 sleeps 3 s between allreduces: the agent's stop reaches it there, before a
          // collective could fail it on its own.
          {kWorker, "--fail-rank", "1", "--exit-code", "3", "--iterations", "3", "--interval-ms",
           "3000"}),
      {});
  ASSERT_EQ(failed.wait(seconds(60)), 3) << failed.output();
  lines = lines_of(read_file(events));
  ASSERT_EQ(lines.size(), 4u) << read_file(events);
  EXPECT_NE(lines[1].find(R"(status.TERMINATED", "source": "WORKER")"), std::string::npos)
      << lines[1];
  EXPECT_NE(lines[2].find(R"(status.FAILED", "source": "WORKER")"), std::string::npos) << lines[2];
  EXPECT_NE(lines[2].find(R"(\"exit_code\": [3])"), std::string::npos) << lines[2];
  EXPECT_NE(lines[2].find(R"("raw_error": "{)"), std::string::npos) << lines[2];
  EXPECT_NE(lines[3].find(R"(status.FAILED", "source": "AGENT")"), std::string::npos) << lines[3];
  EXPECT_NE(lines[3].find("rank 1 (local rank 1)"), std::string::npos) << lines[3];
}

// The body of GET /health on `port` once it answers 200 with `phase`, or the last reply after
// `limit` (for the failure message).
std::string health_in_phase(int port, const std::string& phase, std::chrono::seconds limit) {
  const auto give_up = std::chrono::steady_clock::now() + limit;
  std::string reply;
  while (std::chrono::steady_clock::now() < give_up) {
    reply = ddprun::http_get(port, "GET /health HTTP/1.1\r\n\r\n");
    if (reply.rfind("HTTP/1.0 200", 0) == 0 &&
        reply.find("\"phase\":\"" + phase + "\"") != std::string::npos) {
      return reply;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return "not in phase " + phase + "; last reply: " + reply;
}

// TORCHELASTIC_HEALTH_CHECK_PORT: the agent answers from before the rendezvous (node 1 not there
// yet) through the run.
TEST(DdprunProcess, HealthEndpointAnswersFromTheRendezvousOn) {
  const int port = ddp::testing::free_tcp_port();
  const int health = ddp::testing::free_tcp_port();
  const std::vector<std::string> worker = {kWorker, "--iterations", "30", "--interval-ms", "100"};
  ChildProcess node0(cmd(node_flags(0, port, 1), worker),
                     {{"TORCHELASTIC_HEALTH_CHECK_PORT", std::to_string(health)}});
  const std::string waiting = health_in_phase(health, "rendezvous", seconds(30));
  EXPECT_NE(waiting.find("\"status\":\"healthy\""), std::string::npos) << waiting;
  ChildProcess node1(cmd(node_flags(1, port, 1), worker), {});
  const std::string running = health_in_phase(health, "running", seconds(30));
  EXPECT_NE(running.find("\"status\":\"healthy\""), std::string::npos) << running;
  ASSERT_EQ(node0.wait(seconds(60)), 0) << node0.output();
  ASSERT_EQ(node1.wait(seconds(30)), 0) << node1.output();
  EXPECT_NE(node0.output().find("health: endpoint on port " + std::to_string(health)),
            std::string::npos)
      << node0.output();
}

}  // namespace
}  // namespace ddprun::testing
