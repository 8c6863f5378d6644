// Three simulated Kubernetes pods of an Indexed Job: one network namespace each, joined by a
// bridge (in a namespace of its own, so the host's network is untouched), /etc/netns/<ns>/hosts
// giving each pod the FQDN "train-<i>.train.default.svc.cluster.local", a per-pod hostname
// (unshare --uts) and JOB_COMPLETION_INDEX. ddprun gets no rank, node count or master flags:
// it must derive them as in a real pod. Pod 2 starts before "train-0.train" resolves, as when
// DNS is not ready yet, and must wait for it.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <regex>
#include <tuple>

#include "child_process.h"

namespace ddprun::testing {
namespace {

using std::chrono::seconds;
constexpr int kPods = 3;

bool run(const std::string& command) {
  return std::system((command + " >/dev/null 2>&1").c_str()) == 0;
}

// Each pod's ddprun runs with --tee 3 and TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE='[rank${rank}]:',
// so that every worker line names its global rank.
std::map<std::string, std::string> rank_prefixed(std::map<std::string, std::string> env) {
  env["TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"] = "[rank${rank}]:";
  return env;
}

class NetnsPods : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "needs root to create network namespaces";
    if (!run("ip netns list")) GTEST_SKIP() << "'ip netns' is not available (install iproute2)";
    if (!run("unshare --uts true")) GTEST_SKIP() << "'unshare --uts' is not permitted here";
    prefix_ = "ddprun-t" + std::to_string(getpid());
    bridge_ = prefix_ + "-br";
    ASSERT_TRUE(run("ip netns add " + bridge_));
    created_.push_back(bridge_);
    ASSERT_TRUE(run("ip -n " + bridge_ + " link add br0 type bridge"));
    ASSERT_TRUE(run("ip -n " + bridge_ + " link set br0 up"));
    for (int i = 0; i < kPods; ++i) {
      const std::string ns = pod_ns(i);
      ASSERT_TRUE(run("ip netns add " + ns));
      created_.push_back(ns);
      ASSERT_TRUE(run("ip link add eth0 netns " + ns + " type veth peer name p" +
                      std::to_string(i) + " netns " + bridge_));
      ASSERT_TRUE(run("ip -n " + ns + " addr add " + pod_ip(i) + "/24 dev eth0"));
      ASSERT_TRUE(run("ip -n " + ns + " link set eth0 up"));
      ASSERT_TRUE(run("ip -n " + ns + " link set lo up"));
      ASSERT_TRUE(run("ip -n " + bridge_ + " link set p" + std::to_string(i) + " master br0"));
      ASSERT_TRUE(run("ip -n " + bridge_ + " link set p" + std::to_string(i) + " up"));
      std::filesystem::create_directories("/etc/netns/" + ns);
      write_hosts(i, /*with_master=*/i != 2);
    }
  }

  void TearDown() override {
    for (const auto& ns : created_) {
      run("ip netns del " + ns);
      std::filesystem::remove_all("/etc/netns/" + ns);
    }
  }

  std::string pod_ns(int i) const { return prefix_ + "-pod" + std::to_string(i); }
  static std::string pod_ip(int i) { return "10.213.7." + std::to_string(i + 1); }

  // What the kubelet writes for a pod with a subdomain, plus the headless Service's records
  // that cluster DNS would answer (pod 0's left out to play DNS that is not ready yet).
  void write_hosts(int pod, bool with_master) {
    std::ofstream hosts("/etc/netns/" + pod_ns(pod) + "/hosts", std::ios::trunc);
    hosts << "127.0.0.1 localhost\n";
    for (int i = 0; i < kPods; ++i) {
      if (i == 0 && !with_master && pod != 0) continue;
      const std::string name = "train-" + std::to_string(i);
      hosts << pod_ip(i) << " " << name << ".train.default.svc.cluster.local " << name << ".train"
            << (i == pod ? " " + name : "") << "\n";
    }
  }

  // `nproc` workers per pod; a pod of several gets an IPC namespace of its own as well, so that
  // its workers see one node of their own, as in Kubernetes.
  std::vector<std::string> pod_command(int i,
                                       std::vector<std::string> worker_args = {"--print-env"},
                                       int nproc = 1) const {
    std::vector<std::string> argv{"/usr/sbin/ip",     "netns", "exec", pod_ns(i),
                                  "/usr/bin/unshare", "--uts"};
    if (nproc > 1) argv.emplace_back("--ipc");
    for (std::string arg :
         {std::string("/bin/sh"), std::string("-c"),
          "hostname train-" + std::to_string(i) + " && exec \"$0\" \"$@\"",
          std::string(DDPRUN_PATH), std::string("--nproc-per-node"), std::to_string(nproc),
          std::string("--monitor-interval"), std::string("0.05"), std::string("--tee"),
          std::string("3"), std::string(WORKER_PATH)}) {
      argv.push_back(arg);
    }
    argv.insert(argv.end(), worker_args.begin(), worker_args.end());
    return argv;
  }

  std::string prefix_;
  std::string bridge_;
  std::vector<std::string> created_;
};

TEST_F(NetnsPods, IndexedJobPodsFindTheirRanksAndTheMaster) {
  std::vector<std::unique_ptr<ChildProcess>> pods;
  for (int i : {2, 1, 0}) {
    pods.push_back(std::make_unique<ChildProcess>(
        pod_command(i),
        rank_prefixed({{"JOB_COMPLETION_INDEX", std::to_string(i)}, {"DDP_NNODES", "3"}})));
  }
  ChildProcess& pod2 = *pods[0];
  ASSERT_TRUE(pod2.wait_for_output("cannot resolve 'train-0.train'", seconds(60))) << pod2.output();
  write_hosts(2, /*with_master=*/true);  // DNS catches up

  for (int k = 0; k < kPods; ++k) {
    ASSERT_EQ(pods[static_cast<std::size_t>(k)]->wait(seconds(120)), 0)
        << pods[static_cast<std::size_t>(k)]->output();
  }
  for (int k = 0; k < kPods; ++k) {
    const int i = 2 - k;
    const std::string out = pods[static_cast<std::size_t>(k)]->output();
    const std::string r = std::to_string(i);
    EXPECT_NE(out.find("node " + r +
                       " of 3 (rank from JOB_COMPLETION_INDEX, count from "
                       "DDP_NNODES; Kubernetes Indexed Job)"),
              std::string::npos)
        << out;
    EXPECT_NE(out.find("static rendezvous at train-0.train:29500 (from hostname train-" + r +
                       " and FQDN train-" + r + ".train.default.svc.cluster.local"),
              std::string::npos)
        << out;
    EXPECT_NE(out.find("[rank" + r + "]:env rank=" + r + " GROUP_RANK=" + r), std::string::npos)
        << out;
    EXPECT_NE(out.find("[rank" + r + "]:env rank=" + r + " MASTER_ADDR=train-0.train"),
              std::string::npos)
        << out;
    EXPECT_NE(out.find("[rank" + r + "]:rank=" + r + " sum=6 ok"), std::string::npos) << out;
  }
}

// With a join token, the store on pod 0 serves only the job's pods: pod 2 plays a pod of another
// job (or anything else on the pod network) that can reach train-0.train:29500. Its stray agent
// with a wrong token and its raw torch.distributed client are both refused, and the job runs on,
// while the same raw client on pod 1 (a member) is served.
TEST_F(NetnsPods, WithAJoinTokenOnlyTheJobsPodsReachTheStore) {
  write_hosts(2, /*with_master=*/true);
  char dir_template[] = "/tmp/ddprun-token-XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  const std::string dir = dir_template;
  std::ofstream(dir + "/token") << "job-secret\n";
  std::ofstream(dir + "/wrong") << "guess\n";
  const auto env = [&](int index, const std::string& token) {
    return rank_prefixed({{"JOB_COMPLETION_INDEX", std::to_string(index)},
                          {"DDP_NNODES", "2"},
                          {"DDPRUN_RDZV_TOKEN_FILE", dir + "/" + token}});
  };
  const std::vector<std::string> long_job{"--iterations", "200", "--interval-ms", "50"};
  ChildProcess pod0(pod_command(0, long_job), env(0, "token"));
  ChildProcess pod1(pod_command(1, long_job), env(1, "token"));
  ASSERT_TRUE(pod0.wait_for_output("round 0: node 0 of 2", seconds(60))) << pod0.output();

  // A plain c10d client on pod 1, a member whose agent proved the token, is admitted by its
  // address (as the agent's handshake showed it to the store); the same from pod 2 is not.
  const auto raw_client = [&](int pod, const std::string& key) {
    return ChildProcess({"/usr/sbin/ip", "netns", "exec", pod_ns(pod), "/usr/bin/python3", "-c",
                         "import datetime, torch.distributed as d\n"
                         "s = d.TCPStore('train-0.train', 29500, is_master=False,\n"
                         "               timeout=datetime.timedelta(seconds=10))\n"
                         "s.set('" +
                             key +
                             "', '1')\n"
                             "print('read', s.get('" +
                             key + "'))\n"},
                        {});
  };
  ChildProcess member = raw_client(1, "member");
  EXPECT_EQ(member.wait(seconds(60)), 0) << member.output();
  EXPECT_NE(member.output().find("read b'1'"), std::string::npos) << member.output();

  auto stray_env = env(1, "wrong");  // it claims index 1; its hostname names no master
  stray_env["MASTER_ADDR"] = "train-0.train";
  ChildProcess stray(pod_command(2, long_job), stray_env);
  EXPECT_EQ(stray.wait(seconds(60)), 69) << stray.output();
  EXPECT_NE(stray.output().find("wrong join token"), std::string::npos) << stray.output();

  ChildProcess raw = raw_client(2, "intruder");
  EXPECT_NE(raw.wait(seconds(60)), 0) << raw.output();
  EXPECT_EQ(raw.output().find("read"), std::string::npos) << raw.output();

  EXPECT_EQ(pod1.wait(seconds(120)), 0) << pod1.output();
  EXPECT_EQ(pod0.wait(seconds(60)), 0) << pod0.output();
  const std::string log = pod0.output();
  EXPECT_NE(log.find("refused " + pod_ip(2)), std::string::npos) << log;
  EXPECT_NE(log.find("refused SET from " + pod_ip(2)), std::string::npos) << log;
  std::filesystem::remove_all(dir);
}

// ddprun copied into the PyTorch 2.6 root (tests/interop/prepare-torch2-root), as into a user's
// image: two pods (namespaces) of two ranks each run an unchanged torch.distributed script,
// ddprun and its workers all inside the root.
TEST_F(NetnsPods, DdprunInAPyTorch2RootRunsATwoPodJob) {
  const std::string script = std::string(TEST_SOURCE_DIR) + "/gloo_allreduce.py";
  const std::map<std::string, std::string> env = rank_prefixed(
      {{"DDP_TORCH2_EXEC", DDPRUN_PATH},
       {"DDP_TORCH2_BIND", std::string(TEST_SOURCE_DIR) + ":" +
                               std::filesystem::path(DDPRUN_PATH).parent_path().string()},
       {"GLOO_SOCKET_IFNAME", "eth0"}});
  std::vector<std::unique_ptr<ChildProcess>> pods;
  for (int i : {1, 0}) {
    pods.push_back(std::make_unique<ChildProcess>(
        std::vector<std::string>{
            "/usr/sbin/ip", "netns", "exec", pod_ns(i), std::string(INTEROP_DIR) + "/torch2-python",
            "--nnodes", "2", "--node-rank", std::to_string(i), "--nproc-per-node", "2",
            "--master-addr", pod_ip(0), "--master-port", "29500", "--tee", "3", script},
        env));
  }
  std::string all;
  for (auto& pod : pods) {
    EXPECT_EQ(pod->wait(seconds(240)), 0) << pod->output();
    all += pod->output();
  }
  for (int r = 0; r < 4; ++r) {
    const std::string line = "[rank" + std::to_string(r) + "]:python rank=" + std::to_string(r) +
                             " world=4 sum=10.0 expected=10.0";
    EXPECT_NE(all.find(line), std::string::npos) << line << "\n" << all;
  }
  EXPECT_NE(all.find("[rank0]:torch 2."), std::string::npos) << all;
}

// Two pods of two workers each (pod 2 stays out: DDP_NNODES=2): every rank learns the topology
// from the rendezvous, and both backends run their collectives hierarchically, shared memory
// inside each pod and the pods' network between them, exactly.
TEST_F(NetnsPods, TwoPodsOfTwoRanksRunHierarchicalCollectives) {
  if (!run("ip netns exec " + pod_ns(0) + " unshare --ipc true")) {
    GTEST_SKIP() << "'unshare --ipc' is not permitted here";
  }
  for (const char* backend : {"gloo", "fabric"}) {
    SCOPED_TRACE(backend);
    std::vector<std::unique_ptr<ChildProcess>> pods;
    for (int i : {1, 0}) {
      pods.push_back(
          std::make_unique<ChildProcess>(pod_command(i, {"--topology"}, 2),
                                         rank_prefixed({{"JOB_COMPLETION_INDEX", std::to_string(i)},
                                                        {"DDP_NNODES", "2"},
                                                        {"DDP_BACKEND", backend}})));
    }
    for (auto& pod : pods) ASSERT_EQ(pod->wait(seconds(120)), 0) << pod->output();
    for (auto& pod : pods) {
      const std::string out = pod->output();
      int ranks_seen = 0;
      for (int r = 0; r < 4; ++r) {
        if (out.find("[rank" + std::to_string(r) + "]:") == std::string::npos) continue;
        ++ranks_seen;
        EXPECT_NE(
            out.find("rank=" + std::to_string(r) + " topology=2 nodes × 2 ranks hierarchical=1"),
            std::string::npos)
            << out;
        EXPECT_NE(out.find("rank=" + std::to_string(r) + " large allreduce ok"), std::string::npos)
            << out;
      }
      EXPECT_EQ(ranks_seen, 2) << out;
    }
  }
}

// ddprun doctor's pods: each with a /dev/shm of its own (a private mount namespace with a tmpfs
// of `shm` size), JOB_COMPLETION_INDEX and DDP_NNODES as in an Indexed Job.
class DoctorPods : public NetnsPods {
 protected:
  void SetUp() override {
    NetnsPods::SetUp();
    if (IsSkipped()) return;
    if (!run("unshare --mount true")) GTEST_SKIP() << "'unshare --mount' is not permitted here";
    write_hosts(2, /*with_master=*/true);
  }

  std::unique_ptr<ChildProcess> start(int i, int nodes, const std::string& shm,
                                      const std::vector<std::string>& args) const {
    std::vector<std::string> argv{"/usr/sbin/ip",
                                  "netns",
                                  "exec",
                                  pod_ns(i),
                                  "/usr/bin/unshare",
                                  "--uts",
                                  "--mount",
                                  "/bin/sh",
                                  "-c",
                                  "hostname train-" + std::to_string(i) +
                                      " && mount -t tmpfs -o size=" + shm +
                                      " tmpfs /dev/shm && exec \"$0\" \"$@\"",
                                  DDPRUN_PATH,
                                  "--nproc-per-node",
                                  "1",
                                  "--monitor-interval",
                                  "0.05",
                                  "--tee",
                                  "3"};
    argv.insert(argv.end(), args.begin(), args.end());
    return std::make_unique<ChildProcess>(
        argv, rank_prefixed({{"JOB_COMPLETION_INDEX", std::to_string(i)},
                             {"DDP_NNODES", std::to_string(nodes)},
                             {"DDP_DOCTOR_TRANSFER_MS", "400"}}));
  }

  // A link of its own between pods a and b (a veth pair, and /32 routes that take it instead of
  // the bridge), shaped to `rate` in both directions with tc tbf.
  void shape_link(int a, int b, const std::string& rate) {
    const std::string da = "d" + std::to_string(a) + std::to_string(b);
    const std::string db = "d" + std::to_string(b) + std::to_string(a);
    ASSERT_TRUE(run("ip link add " + da + " netns " + pod_ns(a) + " type veth peer name " + db +
                    " netns " + pod_ns(b)));
    for (const auto& [pod, dev, peer] : {std::tuple{a, da, b}, std::tuple{b, db, a}}) {
      ASSERT_TRUE(run("ip -n " + pod_ns(pod) + " link set " + dev + " up"));
      ASSERT_TRUE(run("ip -n " + pod_ns(pod) + " route add " + pod_ip(peer) + "/32 dev " + dev));
      ASSERT_TRUE(run("ip netns exec " + pod_ns(pod) + " tc qdisc add dev " + dev +
                      " root tbf rate " + rate + " burst 64kb latency 200ms"));
    }
  }
};

// Three pods; the link between train-1 and train-2 is shaped far below the others (200 Mbit/s,
// where the others carry 1 Gbit/s) and train-0's /dev/shm has 16 MiB. The doctor names exactly
// those two problems, and each pod named exits 78.
TEST_F(DoctorPods, NamesTheSlowLinkAndThePodShortOfSharedMemory) {
  shape_link(0, 1, "1gbit");
  shape_link(2, 0, "1gbit");
  shape_link(1, 2, "200mbit");
  std::vector<std::unique_ptr<ChildProcess>> pods;
  for (int i : {2, 1, 0}) pods.push_back(start(i, 3, i == 0 ? "16m" : "1g", {"doctor"}));
  for (auto& pod : pods) EXPECT_EQ(pod->wait(seconds(180)), 78) << pod->output();
  const std::string report = pods[2]->output();  // node 0's
  EXPECT_NE(report.find("ddprun doctor: 3 nodes x 1 ranks, backend gloo"), std::string::npos)
      << report;
  EXPECT_NE(report.find("verdict: 2 problems on train-0, train-1, train-2"), std::string::npos)
      << report;
  EXPECT_NE(report.find("train-0: /dev/shm has 16 MiB free of 16 MiB, needs 256 MiB"),
            std::string::npos)
      << report;
  EXPECT_TRUE(std::regex_search(report, std::regex("train-1 <-> train-2: 0\\.[0-9]+ Gb/s, [0-9]+x "
                                                   "below the median")))
      << report;
  EXPECT_TRUE(std::regex_search(report, std::regex("allreduce busbw \\(Gb/s\\): 4 KiB [0-9.]+;")))
      << report;
  EXPECT_NE(pods[0]->output().find("doctor: this node (node 2) is bad: train-1 <-> train-2"),
            std::string::npos)
      << pods[0]->output();
}

// Three pods whose links are all shaped to 1 Gbit/s pass. The shaping is what makes the links
// equal: an unshaped veth carries what the CPU gives it, and on a small machine shared with other
// tests one link can measure half of another and be named slow.
TEST_F(DoctorPods, PassesHealthyPods) {
  for (const auto& [a, b] : {std::pair{0, 1}, std::pair{1, 2}, std::pair{2, 0}}) {
    shape_link(a, b, "1gbit");
  }
  std::vector<std::unique_ptr<ChildProcess>> pods;
  for (int i : {2, 1, 0}) pods.push_back(start(i, 3, "1g", {"doctor", "train.py"}));
  for (auto& pod : pods) EXPECT_EQ(pod->wait(seconds(180)), 0) << pod->output();
  const std::string report = pods[2]->output();
  EXPECT_NE(report.find("verdict: healthy (3 nodes)"), std::string::npos) << report;
  EXPECT_NE(report.find("train-2 -> train-0"), std::string::npos) << report;
  EXPECT_EQ(report.find("BAD"), std::string::npos) << report;
}

// --preflight: a pod short of /dev/shm keeps the job from starting (78 there, 69 on the other
// pod, no worker ran); with room, the doctor passes and the workers run.
TEST_F(DoctorPods, PreflightFailsFastOrStartsTheWorkers) {
  const std::vector<std::string> job{"--preflight", WORKER_PATH, "--print-env"};
  auto pod1 = start(1, 2, "16m", job);
  auto pod0 = start(0, 2, "1g", job);
  EXPECT_EQ(pod1->wait(seconds(120)), 78) << pod1->output();
  EXPECT_EQ(pod0->wait(seconds(120)), 69) << pod0->output();
  EXPECT_EQ(pod0->output().find("[rank"), std::string::npos) << pod0->output();
  EXPECT_NE(pod0->output().find("doctor: this node is healthy; 1 other node is bad (train-1: "
                                "/dev/shm has 16 MiB free"),
            std::string::npos)
      << pod0->output();

  pod1 = start(1, 2, "1g", job);
  pod0 = start(0, 2, "1g", job);
  EXPECT_EQ(pod1->wait(seconds(120)), 0) << pod1->output();
  EXPECT_EQ(pod0->wait(seconds(120)), 0) << pod0->output();
  EXPECT_NE(pod0->output().find("verdict: healthy (2 nodes)"), std::string::npos) << pod0->output();
  EXPECT_NE(pod0->output().find("[rank0]:rank=0 sum=3 ok"), std::string::npos) << pod0->output();
}

}  // namespace
}  // namespace ddprun::testing
