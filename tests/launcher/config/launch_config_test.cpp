// Resolution of flags, PET_* defaults and Kubernetes pod environments into a LaunchConfig.
#include "config/launch_config.h"

#include <gtest/gtest.h>

#include <csignal>

#include "ddp/error.h"

namespace ddprun {
namespace {

HostFacts test_host(std::string hostname = "laptop", std::string fqdn = "laptop") {
  HostFacts h;
  h.hostname = hostname;
  h.fqdn = [fqdn] { return fqdn; };
  h.usable_cpus = 6;
  h.gpus = 0;
  h.unique_id = "abc123";
  return h;
}

LaunchConfig resolve(std::vector<std::string> args, EnvMap env = {}, HostFacts host = test_host()) {
  args.insert(args.begin(), "ddprun");
  return resolve_launch_config(parse_command_line(args), env, host);
}

// The ConfigError message for a resolution that must fail.
std::string error_of(std::vector<std::string> args, EnvMap env = {}, HostFacts host = test_host()) {
  try {
    resolve(std::move(args), std::move(env), std::move(host));
  } catch (const ddp::ConfigError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a ConfigError";
  return "";
}

TEST(CommandLine, SplitsFlagsFromTheProgramAndItsArguments) {
  auto cli = parse_command_line(
      {"ddprun", "--nproc-per-node", "2", "--nnodes=1", "train.py", "--lr", "0.1", "--nnodes=7"});
  EXPECT_EQ(cli.given.at("nproc-per-node"), "2");
  EXPECT_EQ(cli.given.at("nnodes"), "1");
  EXPECT_EQ(cli.program, (std::vector<std::string>{"train.py", "--lr", "0.1", "--nnodes=7"}));
}

TEST(CommandLine, AcceptsUnderscoreSpellingsAndShortFlags) {
  auto cli = parse_command_line({"ddprun", "--nproc_per_node=3", "--max_restarts", "2", "-r3", "-t",
                                 "1", "--no_python", "-m", "pkg.mod"});
  EXPECT_EQ(cli.given.at("nproc-per-node"), "3");
  EXPECT_EQ(cli.given.at("max-restarts"), "2");
  EXPECT_EQ(cli.given.at("redirects"), "3");
  EXPECT_EQ(cli.given.at("tee"), "1");
  EXPECT_EQ(cli.given.at("no-python"), "true");
  EXPECT_EQ(cli.given.at("module"), "true");
  EXPECT_EQ(cli.program, (std::vector<std::string>{"pkg.mod"}));
}

TEST(CommandLine, DoubleDashEndsTheFlags) {
  auto cli = parse_command_line({"ddprun", "--standalone", "--", "-weird-name", "x"});
  EXPECT_EQ(cli.program, (std::vector<std::string>{"-weird-name", "x"}));
}

TEST(CommandLine, RejectsUnknownFlagsAndMissingValues) {
  EXPECT_THROW(parse_command_line({"ddprun", "--nproc-per-nod", "2", "a"}), ddp::ConfigError);
  EXPECT_THROW(parse_command_line({"ddprun", "--nnodes"}), ddp::ConfigError);
  EXPECT_THROW(parse_command_line({"ddprun", "-x", "a"}), ddp::ConfigError);
  EXPECT_THROW(parse_command_line({"ddprun", "--standalone=maybe", "a"}), ddp::ConfigError);
}

TEST(CommandLine, HelpDocumentsEveryFlag) {
  auto cli = parse_command_line({"ddprun", "--help"});
  EXPECT_TRUE(cli.help);
  const std::string help = help_text();
  for (const auto& spec : flag_specs()) {
    EXPECT_NE(help.find("--" + std::string(spec.name)), std::string::npos) << spec.name;
  }
  EXPECT_NE(help.find("PET_NPROC_PER_NODE"), std::string::npos);
}

TEST(LaunchConfig, DefaultsMatchTorchrun) {
  auto c = resolve({"./trainer", "--epochs", "2"});
  EXPECT_EQ(c.min_nodes, 1);
  EXPECT_EQ(c.max_nodes, 1);
  EXPECT_EQ(c.nproc_per_node, 1);
  EXPECT_EQ(c.node_rank, 0);
  EXPECT_EQ(c.rdzv_backend, RdzvBackend::kStatic);
  EXPECT_EQ(c.store_host, "127.0.0.1");
  EXPECT_EQ(c.store_port, 29500);
  EXPECT_EQ(c.run_id, "none");
  EXPECT_EQ(c.max_restarts, 0);
  EXPECT_EQ(c.shutdown_timeout, std::chrono::seconds(30));
  EXPECT_EQ(c.signals_to_handle, (std::vector<int>{SIGTERM, SIGINT, SIGHUP, SIGQUIT}));
  EXPECT_EQ(c.command, (std::vector<std::string>{"./trainer", "--epochs", "2"}));
  EXPECT_TRUE(c.platform.empty());
}

TEST(LaunchConfig, PythonScriptsAndModulesRunUnbuffered) {
  EXPECT_EQ(resolve({"train.py", "a"}).command,
            (std::vector<std::string>{"python3", "-u", "train.py", "a"}));
  EXPECT_EQ(resolve({"-m", "pkg.train", "a"}, {{"PYTHON_EXEC", "/usr/bin/python3"}}).command,
            (std::vector<std::string>{"/usr/bin/python3", "-u", "-m", "pkg.train", "a"}));
  EXPECT_EQ(resolve({"--no-python", "tool.py"}).command, (std::vector<std::string>{"tool.py"}));
  EXPECT_NE(error_of({"--no-python", "-m", "pkg"}).find("exclude"), std::string::npos);
  EXPECT_NE(error_of({}).find("no program"), std::string::npos);
}

TEST(LaunchConfig, ExplicitFlagWinsOverPetEnvironment) {
  EnvMap env = {{"PET_NPROC_PER_NODE", "4"},
                {"PET_NNODES", "3"},
                {"PET_NODE_RANK", "2"},
                {"PET_MASTER_ADDR", "10.0.0.1"},
                {"PET_MASTER_PORT", "1234"}};
  auto from_env = resolve({"a"}, env);
  EXPECT_EQ(from_env.nproc_per_node, 4);
  EXPECT_EQ(from_env.max_nodes, 3);
  EXPECT_EQ(from_env.node_rank, 2);
  EXPECT_EQ(from_env.store_host, "10.0.0.1");
  EXPECT_EQ(from_env.store_port, 1234);
  EXPECT_EQ(from_env.node_rank_source, "PET_NODE_RANK");

  auto flags =
      resolve({"--nproc-per-node", "2", "--node-rank", "1", "--master-port", "99", "a"}, env);
  EXPECT_EQ(flags.nproc_per_node, 2);
  EXPECT_EQ(flags.node_rank, 1);
  EXPECT_EQ(flags.store_port, 99);
  EXPECT_EQ(flags.node_rank_source, "--node-rank");
}

TEST(LaunchConfig, PetSwitchesAndEveryOtherPetDefault) {
  EnvMap env = {{"PET_STANDALONE", "1"},
                {"PET_MAX_RESTARTS", "3"},
                {"PET_MONITOR_INTERVAL", "0.5"},
                {"PET_LOG_DIR", "/tmp/l"},
                {"PET_REDIRECTS", "3"},
                {"PET_TEE", "0:1,1:2"},
                {"PET_LOCAL_RANKS_FILTER", "0"},
                {"PET_SHUTDOWN_TIMEOUT", "2.5"},
                {"PET_SIGNALS_TO_HANDLE", "SIGUSR1,TERM"},
                {"PET_ROLE", "trainer"},
                {"PET_NPROC_PER_NODE", "2"},
                {"PET_LOCAL_ADDR", "10.1.1.1"}};
  auto c = resolve({"a"}, env);
  EXPECT_TRUE(c.standalone);
  EXPECT_EQ(c.max_restarts, 3);
  EXPECT_EQ(c.monitor_interval, std::chrono::milliseconds(500));
  EXPECT_EQ(c.log_dir, "/tmp/l");
  EXPECT_EQ(c.redirects.for_rank(5), kBothStreams);
  EXPECT_EQ(c.tee.for_rank(0), kStdout);
  EXPECT_EQ(c.tee.for_rank(1), kStderr);
  EXPECT_EQ(c.tee.for_rank(2), kNoStreams);
  EXPECT_EQ(*c.local_ranks_filter, (std::set<int>{0}));
  EXPECT_EQ(c.shutdown_timeout, std::chrono::milliseconds(2500));
  EXPECT_EQ(c.signals_to_handle, (std::vector<int>{SIGUSR1, SIGTERM}));
  EXPECT_EQ(c.role, "trainer");
  EXPECT_EQ(c.local_addr, "10.1.1.1");
  EXPECT_NE(error_of({"a"}, {{"PET_STANDALONE", "sure"}}).find("PET_STANDALONE"),
            std::string::npos);
}

TEST(LaunchConfig, EtcdBackendTakesTorchrunsNamesEndpointAndConf) {
  for (const char* name : {"etcd-v2", "etcd"}) {
    auto c = resolve({"--nnodes", "1:4", "--rdzv-backend", name, "--rdzv-endpoint", "etcd-svc",
                      "--rdzv-id", "j", "a"});
    EXPECT_EQ(c.rdzv_backend, RdzvBackend::kEtcd);
    EXPECT_EQ(c.store_host, "etcd-svc");
    EXPECT_EQ(c.store_port, 2379);  // etcd's client port
    EXPECT_EQ(c.worker_store_port, 0) << "a free port unless --master-port says";
    EXPECT_FALSE(c.node_rank.has_value()) << "host name order, as with c10d";
    EXPECT_NE(c.describe().find("etcd-v2 rendezvous at etcd-svc:2379"), std::string::npos);
  }
  auto c = resolve({"--nnodes", "2", "--rdzv-backend", "etcd-v2", "--rdzv-endpoint", "e:2380",
                    "--master-port", "29501", "--rdzv-conf",
                    "etcd_prefix=/torchelastic/p2p,protocol=https,cacert=/ca,cert=/c,key=/k", "a"});
  EXPECT_EQ(c.store_port, 2380);
  EXPECT_EQ(c.worker_store_port, 29501);
  EXPECT_EQ(c.rdzv.etcd_prefix, "/torchelastic/p2p");
  EXPECT_EQ(c.rdzv.etcd_protocol, "https");
  EXPECT_EQ(c.rdzv.etcd_cacert, "/ca");
  EXPECT_EQ(c.rdzv.etcd_cert, "/c");
  EXPECT_EQ(c.rdzv.etcd_key, "/k");
  EXPECT_TRUE(c.notices.empty());
  EXPECT_NE(error_of({"a"}, {{"PET_RDZV_BACKEND", "etcd-v2"}})
                .find("PET_RDZV_BACKEND=etcd-v2 "
                      "needs --rdzv-endpoint"),
            std::string::npos);
  EXPECT_NE(error_of({"--rdzv-backend", "etcd-v2", "--rdzv-endpoint", "e", "--rdzv-conf",
                      "etcd_prefix=ddp", "a"})
                .find("must start with '/'"),
            std::string::npos);
  EXPECT_NE(error_of({"--rdzv-backend", "etcd-v2", "--rdzv-endpoint", "e", "--rdzv-conf",
                      "protocol=grpc", "a"})
                .find("not http or https"),
            std::string::npos);
}

TEST(LaunchConfig, StandaloneUsesAFreePortAndAFreshRunId) {
  auto c = resolve({"--standalone", "--nproc-per-node", "2", "a"});
  EXPECT_EQ(c.rdzv_backend, RdzvBackend::kC10d);
  EXPECT_EQ(c.store_port, 0);
  EXPECT_EQ(c.run_id, "abc123");
  EXPECT_EQ(c.node_rank, 0);
  EXPECT_NE(error_of({"--standalone", "--nnodes", "2", "a"}).find("--standalone"),
            std::string::npos);
}

// torchrun's opt-out of sharing its store with the workers, read as torch reads it ("1" only).
TEST(LaunchConfig, TorchDisableShareRdzvTcpStoreMakesWorkerRankZeroServeTheStore) {
  EXPECT_TRUE(resolve({"--standalone", "a"}).share_worker_store);
  EXPECT_TRUE(resolve({"--standalone", "a"}, {{"TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "0"}})
                  .share_worker_store);
  const auto c = resolve({"--standalone", "a"}, {{"TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1"}});
  EXPECT_FALSE(c.share_worker_store);
  EXPECT_NE(c.describe().find("worker rank 0 serves the workers' store"), std::string::npos);
}

TEST(LaunchConfig, NprocKeywords) {
  EXPECT_EQ(resolve({"--nproc-per-node", "cpu", "a"}).nproc_per_node, 6);
  EXPECT_EQ(resolve({"--nproc-per-node", "auto", "a"}).nproc_per_node, 6);
  auto gpu_host = test_host();
  gpu_host.gpus = 8;
  EXPECT_EQ(resolve({"--nproc-per-node", "auto", "a"}, {}, gpu_host).nproc_per_node, 8);
  EXPECT_NE(error_of({"--nproc-per-node", "gpu", "a"}).find("no GPUs"), std::string::npos);
  EXPECT_NE(error_of({"--nproc-per-node", "two", "a"}).find("--nproc-per-node"), std::string::npos);
  EXPECT_NE(error_of({"--nproc-per-node", "0", "a"}).find("--nproc-per-node"), std::string::npos);
  EXPECT_NE(error_of({"a"}, {{"PET_NPROC_PER_NODE", "x"}}).find("PET_NPROC_PER_NODE"),
            std::string::npos);
}

TEST(LaunchConfig, NodeCountsAndElasticRanges) {
  auto c = resolve({"--nnodes", "2:4", "--rdzv-backend", "c10d", "--rdzv-endpoint", "h", "a"});
  EXPECT_EQ(c.min_nodes, 2);
  EXPECT_EQ(c.max_nodes, 4);
  EXPECT_FALSE(c.node_rank.has_value());  // the host name decides
  EXPECT_EQ(c.store_host, "h");
  EXPECT_EQ(c.store_port, 29400);
  EXPECT_NE(error_of({"--nnodes", "2:4", "a"}).find("elastic range"), std::string::npos);
  EXPECT_NE(error_of({"--nnodes", "4:2", "--rdzv-backend", "c10d", "a"}).find("minimum"),
            std::string::npos);
  EXPECT_NE(error_of({"--nnodes", "x", "a"}).find("--nnodes"), std::string::npos);
  EXPECT_NE(error_of({"--nnodes", "0", "a"}).find("--nnodes"), std::string::npos);
}

TEST(LaunchConfig, NodeRankMustBeBelowNodeCount) {
  const auto msg = error_of({"--nnodes", "2", "--node-rank", "2", "a"});
  EXPECT_NE(msg.find("node rank 2 (from --node-rank)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("node count 2 (from --nnodes)"), std::string::npos) << msg;
  EXPECT_NE(error_of({"--node-rank", "-1", "a"}).find("--node-rank"), std::string::npos);
  EXPECT_NE(error_of({"a"}, {{"PET_NODE_RANK", "one"}}).find("PET_NODE_RANK"), std::string::npos);
}

TEST(LaunchConfig, RendezvousEndpointsAndOptions) {
  auto c = resolve({"--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "[fd00::1]:7",
                    "--rdzv-conf", "join_timeout=5,last_call_timeout=0.5,is_host=0,foo=1",
                    "--rdzv-id", "job7", "a"});
  EXPECT_EQ(c.store_host, "fd00::1");
  EXPECT_EQ(c.store_port, 7);
  EXPECT_EQ(c.rdzv.join_timeout, std::chrono::seconds(5));
  EXPECT_EQ(c.rdzv.last_call_timeout, std::chrono::milliseconds(500));
  EXPECT_EQ(c.rdzv.is_host, false);
  EXPECT_EQ(c.run_id, "job7");
  ASSERT_EQ(c.notices.size(), 1u);
  EXPECT_NE(c.notices[0].find("foo"), std::string::npos);

  auto s = resolve({"--rdzv-endpoint", "store.local:555", "a"});
  EXPECT_EQ(s.rdzv_backend, RdzvBackend::kStatic);
  EXPECT_EQ(s.store_host, "store.local");
  EXPECT_EQ(s.store_port, 555);

  EXPECT_NE(error_of({"--rdzv-backend", "zookeeper", "a"}).find("'c10d', 'etcd-v2' or 'static'"),
            std::string::npos);
  EXPECT_NE(error_of({"--rdzv-conf", "join_timeout=soon", "a"}).find("join_timeout"),
            std::string::npos);
  EXPECT_NE(error_of({"--rdzv-conf", "join_timeout", "a"}).find("KEY=VALUE"), std::string::npos);
  EXPECT_NE(error_of({"--rdzv-endpoint", "h:port", "a"}).find("port"), std::string::npos);
  EXPECT_NE(error_of({"--rdzv-endpoint", ":80", "a"}).find("no host"), std::string::npos);
  EXPECT_NE(error_of({"--master-port", "70000", "a"}).find("--master-port"), std::string::npos);
}

TEST(LaunchConfig, BadSupervisionAndOutputValuesNameTheFlag) {
  EXPECT_NE(error_of({"--max-restarts", "-1", "a"}).find("--max-restarts"), std::string::npos);
  EXPECT_NE(error_of({"--monitor-interval", "0", "a"}).find("--monitor-interval"),
            std::string::npos);
  EXPECT_NE(error_of({"--shutdown-timeout", "soon", "a"}).find("--shutdown-timeout"),
            std::string::npos);
  EXPECT_NE(error_of({"--signals-to-handle", "SIGKILL", "a"}).find("SIGKILL"), std::string::npos);
  EXPECT_NE(error_of({"--signals-to-handle", "SIGNOPE", "a"}).find("SIGNOPE"), std::string::npos);
  EXPECT_NE(error_of({"--redirects", "4", "a"}).find("--redirects"), std::string::npos);
  EXPECT_NE(error_of({"--tee", "0-1", "a"}).find("--tee"), std::string::npos);
  EXPECT_NE(error_of({"--local-ranks-filter", "1", "a"}).find("not below"), std::string::npos);
  EXPECT_NE(error_of({"--start-method", "thread", "a"}).find("--start-method"), std::string::npos);
  EXPECT_EQ(resolve({"--start-method", "fork", "--run-path", "a"}).notices.size(), 2u);
}

// The flags and variables torchrun gained after 2.4 (run.py and elastic/ on PyTorch main).
TEST(LaunchConfig, TimeoutsFallBackToTorchrunsVariables) {
  EXPECT_EQ(resolve({"a"}).rdzv.exit_barrier_timeout, std::chrono::seconds(300));
  const EnvMap env = {{"TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "7"},
                      {"TORCH_ELASTIC_EXIT_BARRIER_TIMEOUT", "12.5"}};
  auto c = resolve({"a"}, env);
  EXPECT_EQ(c.shutdown_timeout, std::chrono::seconds(7));
  EXPECT_EQ(c.rdzv.exit_barrier_timeout, std::chrono::milliseconds(12500));
  // The flag, or its PET_ form, wins over the variable.
  c = resolve({"--shutdown-timeout", "3", "--exit-barrier-timeout", "0", "a"}, env);
  EXPECT_EQ(c.shutdown_timeout, std::chrono::seconds(3));
  EXPECT_EQ(c.rdzv.exit_barrier_timeout, std::chrono::seconds(0));
  EXPECT_EQ(resolve({"a"}, {{"PET_SHUTDOWN_TIMEOUT", "4"}, {"TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "9"}})
                .shutdown_timeout,
            std::chrono::seconds(4));
  // --rdzv-conf's key is on the command line too: the variable does not override it.
  EXPECT_EQ(resolve({"--rdzv-conf", "exit_barrier_timeout=40", "a"}, env).rdzv.exit_barrier_timeout,
            std::chrono::seconds(40));
  EXPECT_EQ(resolve({"--rdzv-conf", "exit_barrier_timeout=40", "--exit-barrier-timeout", "41", "a"})
                .rdzv.exit_barrier_timeout,
            std::chrono::seconds(41));
  EXPECT_NE(error_of({"a"}, {{"TORCH_ELASTIC_EXIT_BARRIER_TIMEOUT", "-1"}})
                .find("TORCH_ELASTIC_EXIT_BARRIER_TIMEOUT"),
            std::string::npos);
  EXPECT_NE(error_of({"a"}, {{"TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "soon"}})
                .find("TORCH_ELASTIC_SHUTDOWN_TIMEOUT"),
            std::string::npos);
}

TEST(LaunchConfig, DuplicateFiltersSplitOnCommasAndKeepDoubledOnes) {
  auto c = resolve({"--duplicate-stdout-filters", "loss,,acc,epoch", "--duplicate_stderr_filters",
                    "Traceback", "a"});
  EXPECT_EQ(c.duplicate_stdout_filters, (std::vector<std::string>{"loss,acc", "epoch"}));
  EXPECT_EQ(c.duplicate_stderr_filters, (std::vector<std::string>{"Traceback"}));
  EXPECT_TRUE(resolve({"a"}).duplicate_stdout_filters.empty());
  EXPECT_EQ(resolve({"a"}, {{"PET_DUPLICATE_STDOUT_FILTERS", "x,y"}}).duplicate_stdout_filters,
            (std::vector<std::string>{"x", "y"}));
  EXPECT_EQ(split_filter_list("a,,,b"), (std::vector<std::string>{"a,", "b"}));
}

TEST(LaunchConfig, TheLinePrefixTemplateComesFromTorchelasticsVariable) {
  EXPECT_FALSE(resolve({"a"}).log_line_prefix_template);
  EXPECT_EQ(resolve({"a"}, {{"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", "${rank}:"}})
                .log_line_prefix_template,
            "${rank}:");
}

TEST(LaunchConfig, VirtualLocalRankNeedsADevicePerWorker) {
  EXPECT_TRUE(resolve({"--virtual-local-rank", "--nproc-per-node", "2", "a"}).virtual_local_rank);
  EXPECT_TRUE(resolve({"a"}, {{"PET_VIRTUAL_LOCAL_RANK", "1"}}).virtual_local_rank);
  EXPECT_FALSE(resolve({"a"}).virtual_local_rank);
  EXPECT_NE(error_of({"--virtual-local-rank", "--nproc-per-node", "3", "a"},
                     {{"CUDA_VISIBLE_DEVICES", "0,1"}})
                .find("CUDA_VISIBLE_DEVICES=0,1 lists 2 devices for 3 workers"),
            std::string::npos);
}

// torchrun 2.9's --numa-binding: its four values from the flag (either spelling) or
// PET_NUMA_BINDING; anything else is one line naming the source and the values.
TEST(LaunchConfig, NumaBindingTakesTorchrunsValuesFromTheFlagOrPet) {
  EXPECT_FALSE(resolve({"a"}).numa_binding.has_value());
  EXPECT_EQ(resolve({"--numa-binding", "exclusive", "a"}).numa_binding, BindingPolicy::kExclusive);
  EXPECT_EQ(resolve({"--numa_binding=core-complex", "a"}).numa_binding,
            BindingPolicy::kCoreComplex);
  EXPECT_EQ(resolve({"a"}, {{"PET_NUMA_BINDING", "socket"}}).numa_binding, BindingPolicy::kSocket);
  EXPECT_EQ(resolve({"--numa-binding", "node", "a"}, {{"PET_NUMA_BINDING", "socket"}}).numa_binding,
            BindingPolicy::kNode);
  EXPECT_NE(resolve({"--numa-binding", "node", "a"}).describe().find("--numa-binding node"),
            std::string::npos);
  EXPECT_EQ(error_of({"--numa-binding", "numa", "a"}),
            "--numa-binding='numa' is not a binding; use node, socket, exclusive or "
            "core-complex (torchrun's names), or leave it out for no binding");
  EXPECT_NE(error_of({"a"}, {{"PET_NUMA_BINDING", "cores"}}).find("PET_NUMA_BINDING='cores'"),
            std::string::npos);
  EXPECT_THROW(parse_command_line({"ddprun", "--numa-binding"}), ddp::ConfigError);
}

TEST(LaunchConfig, CollectivesDdprunComesFromTheFlagPetOrDdpTorchCollectives) {
  EXPECT_FALSE(resolve({"a"}).ddprun_collectives);
  EXPECT_TRUE(resolve({"--collectives", "ddprun", "a"}).ddprun_collectives);
  EXPECT_TRUE(resolve({"a"}, {{"PET_COLLECTIVES", "ddprun"}}).ddprun_collectives);
  EXPECT_TRUE(resolve({"a"}, {{"DDP_TORCH_COLLECTIVES", "ddprun"}}).ddprun_collectives);
  EXPECT_FALSE(resolve({"--collectives", "torch", "a"}, {{"DDP_TORCH_COLLECTIVES", "ddprun"}})
                   .ddprun_collectives);
  const std::string error = error_of({"--collectives", "nccl", "a"});
  EXPECT_NE(error.find("--collectives=nccl: 'torch'"), std::string::npos) << error;
}

TEST(LaunchConfig, ThePythonHookIsOnUnlessTurnedOffAndCollectivesNeedIt) {
  EXPECT_TRUE(resolve({"a"}).python_hook);
  EXPECT_FALSE(resolve({"a"}, {{"DDP_PYTHON_HOOK", "off"}}).python_hook);
  EXPECT_NE(error_of({"a"}, {{"DDP_PYTHON_HOOK", "no"}}).find("DDP_PYTHON_HOOK=no: 'on'"),
            std::string::npos);
  const std::string error =
      error_of({"--collectives", "ddprun", "a"}, {{"DDP_PYTHON_HOOK", "off"}});
  EXPECT_NE(error.find("--collectives ddprun works through ddprun's Python hook"),
            std::string::npos)
      << error;
}

TEST(LaunchConfig, LogsSpecsOtherThanTheDefaultAreRefused) {
  const std::string error = error_of({"--logs-specs", "my_specs", "a"});
  EXPECT_NE(error.find("--logs-specs='my_specs'"), std::string::npos) << error;
  EXPECT_NE(error.find("drop the flag"), std::string::npos) << error;
}

TEST(LaunchConfig, HealthCheckPortComesFromTorchelasticsVariable) {
  EXPECT_EQ(resolve({"a"}).health_check_port, 0);
  EXPECT_EQ(resolve({"a"}, {{"TORCHELASTIC_HEALTH_CHECK_PORT", "8081"}}).health_check_port, 8081);
  EXPECT_NE(error_of({"a"}, {{"TORCHELASTIC_HEALTH_CHECK_PORT", "http"}})
                .find("TORCHELASTIC_HEALTH_CHECK_PORT"),
            std::string::npos);
}

TEST(LaunchConfig, SignalsToHandleKeepTheirSpellingForTheWorkers) {
  EXPECT_EQ(resolve({"a"}).signals_to_handle_text, "SIGTERM,SIGINT,SIGHUP,SIGQUIT");
  EXPECT_EQ(resolve({"--signals-to-handle", "SIGUSR1,SIGTERM", "a"}).signals_to_handle_text,
            "SIGUSR1,SIGTERM");
}

TEST(LaunchConfig, EveryBadEnvironmentValueNamesItsVariable) {
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"PET_NNODES", "many"},
      {"PET_NNODES", "3:1"},
      {"PET_NODE_RANK", "1.5"},
      {"PET_MASTER_PORT", "http"},
      {"PET_RDZV_BACKEND", "zookeeper"},
      {"PET_RDZV_ENDPOINT", ":1"},
      {"PET_RDZV_CONF", "read_timeout=-1"},
      {"PET_MAX_RESTARTS", "x"},
      {"PET_MONITOR_INTERVAL", "-1"},
      {"PET_SHUTDOWN_TIMEOUT", "later"},
      {"PET_REDIRECTS", "7"},
      {"PET_TEE", "a:b"},
      {"PET_LOCAL_RANKS_FILTER", "z"},
      {"PET_SIGNALS_TO_HANDLE", "SIGFOO"},
      {"PET_START_METHOD", "threads"},
      {"PET_NO_PYTHON", "perhaps"},
      {"PET_NUMA_BINDING", "all"},
      {"DDP_NNODES", "abc"},
      {"MASTER_PORT", "99999"}};
  for (const auto& [name, value] : bad) {
    const std::string msg = error_of({"a"}, {{name, value}});
    EXPECT_NE(msg.find(name), std::string::npos) << name << "=" << value << ": " << msg;
  }
}

TEST(Kubernetes, IndexedJobDerivesRankAndMasterFromThePodNames) {
  auto c =
      resolve({"--nproc-per-node", "2", "a"}, {{"JOB_COMPLETION_INDEX", "2"}, {"DDP_NNODES", "3"}},
              test_host("train-2", "train-2.train.default.svc.cluster.local"));
  EXPECT_EQ(c.platform, "Kubernetes Indexed Job");
  EXPECT_EQ(c.node_rank, 2);
  EXPECT_EQ(c.node_rank_source, "JOB_COMPLETION_INDEX");
  EXPECT_EQ(c.max_nodes, 3);
  EXPECT_EQ(c.nnodes_source, "DDP_NNODES");
  EXPECT_EQ(c.store_host, "train-0.train");
  EXPECT_EQ(c.store_port, 29500);
  EXPECT_NE(c.describe().find("train-0.train:29500"), std::string::npos) << c.describe();
}

TEST(Kubernetes, AnElasticIndexedJobLooksForAMovedStoreAtEachOfItsPods) {
  const auto host = test_host("train-2", "train-2.train.default.svc.cluster.local");
  auto c = resolve({"--rdzv-backend", "c10d", "--nnodes", "2:3", "a"},
                   {{"JOB_COMPLETION_INDEX", "2"}}, host);
  EXPECT_EQ(c.rdzv.store_peers,
            (std::vector<std::string>{"train-0.train", "train-1.train", "train-2.train"}));
  // Fixed size, or another backend: the store never moves.
  EXPECT_TRUE(resolve({"--rdzv-backend", "c10d", "--nnodes", "3", "a"},
                      {{"JOB_COMPLETION_INDEX", "2"}}, host)
                  .rdzv.store_peers.empty());
  EXPECT_TRUE(
      resolve({"--rdzv-backend", "etcd-v2", "--rdzv-endpoint", "etcd", "--nnodes", "2:3", "a"},
              {{"JOB_COMPLETION_INDEX", "2"}}, host)
          .rdzv.store_peers.empty());
  // Given peers win; ';' separates them, since ',' separates the options.
  auto given = resolve({"--rdzv-backend", "c10d", "--nnodes", "2:3", "--rdzv-conf",
                        "store_peers=10.0.0.1;;10.0.0.2,join_timeout=5", "a"},
                       {{"JOB_COMPLETION_INDEX", "2"}}, host);
  EXPECT_EQ(given.rdzv.store_peers, (std::vector<std::string>{"10.0.0.1", "10.0.0.2"}));
  EXPECT_EQ(given.rdzv.join_timeout, std::chrono::seconds(5));
}

TEST(Kubernetes, IndexedJobErrors) {
  const auto host = test_host("train-1", "train-1.train.default.svc.cluster.local");
  auto no_count = error_of({"a"}, {{"JOB_COMPLETION_INDEX", "1"}}, host);
  EXPECT_NE(no_count.find("node count is unknown"), std::string::npos) << no_count;
  EXPECT_NE(no_count.find("DDP_NNODES"), std::string::npos) << no_count;
  auto too_big = error_of({"--nnodes", "1", "a"}, {{"JOB_COMPLETION_INDEX", "1"}}, host);
  EXPECT_NE(too_big.find("JOB_COMPLETION_INDEX"), std::string::npos) << too_big;
  EXPECT_NE(error_of({"a"}, {{"JOB_COMPLETION_INDEX", "x1"}, {"DDP_NNODES", "2"}}, host)
                .find("JOB_COMPLETION_INDEX"),
            std::string::npos);
  auto no_subdomain = error_of({"a"}, {{"JOB_COMPLETION_INDEX", "1"}, {"DDP_NNODES", "2"}},
                               test_host("train-1", "train-1"));
  EXPECT_NE(no_subdomain.find("subdomain"), std::string::npos) << no_subdomain;
  auto odd_name = error_of({"a"}, {{"JOB_COMPLETION_INDEX", "1"}, {"DDP_NNODES", "2"}},
                           test_host("worker", "worker.train.default.svc"));
  EXPECT_NE(odd_name.find("--master-addr"), std::string::npos) << odd_name;
  // An explicit master needs no derivation.
  EXPECT_EQ(
      resolve({"--master-addr", "m", "a"}, {{"JOB_COMPLETION_INDEX", "1"}, {"DDP_NNODES", "2"}},
              test_host("worker", "worker"))
          .store_host,
      "m");
  auto disagree = error_of(
      {"a"}, {{"JOB_COMPLETION_INDEX", "1"}, {"PET_NODE_RANK", "0"}, {"PET_NNODES", "2"}}, host);
  EXPECT_NE(disagree.find("PET_NODE_RANK=0 disagrees with JOB_COMPLETION_INDEX"), std::string::npos)
      << disagree;
  auto two_counts = error_of({"a"}, {{"PET_NNODES", "2"}, {"DDP_NNODES", "3"}});
  EXPECT_NE(two_counts.find("disagree"), std::string::npos) << two_counts;
}

TEST(Kubernetes, TrainJobSetsPetVariables) {
  auto c = resolve({"a"}, {{"PET_NNODES", "4"},
                           {"PET_NPROC_PER_NODE", "2"},
                           {"PET_NODE_RANK", "3"},
                           {"PET_MASTER_ADDR", "tj-node-0-0.tj"},
                           {"PET_MASTER_PORT", "29400"},
                           {"JOB_COMPLETION_INDEX", "3"},
                           {"JOBSET_NAME", "tj"},
                           {"REPLICATED_JOB_NAME", "node"}});
  EXPECT_EQ(c.node_rank, 3);
  EXPECT_EQ(c.max_nodes, 4);
  EXPECT_EQ(c.nproc_per_node, 2);
  EXPECT_EQ(c.store_host, "tj-node-0-0.tj");
  EXPECT_EQ(c.store_port, 29400);
}

TEST(Kubernetes, JobSetDerivesMasterAndRankAcrossJobs) {
  auto c = resolve({"--nnodes", "4", "a"},
                   {{"JOBSET_NAME", "js"},
                    {"REPLICATED_JOB_NAME", "workers"},
                    {"JOB_INDEX", "1"},
                    {"REPLICATED_JOB_REPLICAS", "2"},
                    {"JOB_COMPLETION_INDEX", "1"}},
                   test_host("js-workers-1-1", "js-workers-1-1.js.default.svc.cluster.local"));
  EXPECT_EQ(c.platform, "JobSet");
  EXPECT_EQ(c.node_rank, 3);  // job 1 of 2, pod 1 of 2
  EXPECT_EQ(c.store_host, "js-workers-0-0.js");
  auto single = resolve({"--nnodes", "2", "a"},
                        {{"JOBSET_NAME", "js"},
                         {"REPLICATED_JOB_NAME", "w"},
                         {"JOB_INDEX", "1"},
                         {"REPLICATED_JOB_REPLICAS", "2"}},
                        test_host("js-w-1-0", "js-w-1-0"));
  EXPECT_EQ(single.node_rank, 1);
  EXPECT_EQ(single.store_host, "js-w-0-0.js");  // the JobSet's default subdomain
  EXPECT_NE(error_of({"--nnodes", "3", "a"}, {{"JOBSET_NAME", "js"},
                                              {"REPLICATED_JOB_NAME", "w"},
                                              {"JOB_INDEX", "1"},
                                              {"REPLICATED_JOB_REPLICAS", "2"},
                                              {"JOB_COMPLETION_INDEX", "0"}})
                .find("multiple"),
            std::string::npos);
  EXPECT_NE(error_of({"--nnodes", "2", "a"},
                     {{"JOBSET_NAME", "js"}, {"REPLICATED_JOB_NAME", "w"}, {"JOB_INDEX", "first"}})
                .find("JOB_INDEX"),
            std::string::npos);
  EXPECT_NE(error_of({"--nnodes", "2", "a"}, {{"JOBSET_NAME", "js"}}).find("REPLICATED_JOB_NAME"),
            std::string::npos);
  EXPECT_NE(error_of({"a"}, {{"JOBSET_NAME", "js"}, {"REPLICATED_JOB_NAME", "w"}})
                .find("node count is unknown"),
            std::string::npos);
}

TEST(Kubernetes, PyTorchJobRankIsTheNodeRank) {
  EnvMap env = {
      {"MASTER_ADDR", "pj-master-0"}, {"MASTER_PORT", "23456"}, {"WORLD_SIZE", "3"}, {"RANK", "2"}};
  auto c = resolve({"--nproc-per-node", "2", "a"}, env);
  EXPECT_EQ(c.platform, "Kubeflow PyTorchJob");
  EXPECT_EQ(c.node_rank, 2);
  EXPECT_EQ(c.node_rank_source, "RANK");
  EXPECT_EQ(c.max_nodes, 3);
  EXPECT_EQ(c.nnodes_source, "WORLD_SIZE");
  EXPECT_EQ(c.store_host, "pj-master-0");
  EXPECT_EQ(c.store_port, 23456);
  env["RANK"] = "3";
  EXPECT_NE(error_of({"a"}, env).find("RANK=3 is not below WORLD_SIZE=3"), std::string::npos);
  env["RANK"] = "x";
  EXPECT_NE(error_of({"a"}, env).find("RANK"), std::string::npos);
  env["RANK"] = "0";
  env["WORLD_SIZE"] = "0";
  EXPECT_NE(error_of({"a"}, env).find("WORLD_SIZE"), std::string::npos);
  env["WORLD_SIZE"] = "3";
  EXPECT_NE(
      error_of({"--nnodes", "2", "a"}, {{"MASTER_ADDR", "m"}, {"RANK", "2"}, {"WORLD_SIZE", "3"}})
          .find("node rank 2 (from RANK)"),
      std::string::npos);
  env["MASTER_PORT"] = "0x10";
  EXPECT_NE(error_of({"a"}, env).find("MASTER_PORT"), std::string::npos);
}

TEST(Kubernetes, ElasticPyTorchJobUsesPetRendezvous) {
  auto c = resolve({"a"}, {{"MASTER_ADDR", "pj-master-0"},
                           {"MASTER_PORT", "23456"},
                           {"WORLD_SIZE", "4"},
                           {"RANK", "1"},
                           {"PET_NNODES", "1:4"},
                           {"PET_RDZV_BACKEND", "c10d"},
                           {"PET_RDZV_ENDPOINT", "pj-master-0:23456"},
                           {"PET_RDZV_ID", "pj"}});
  EXPECT_EQ(c.platform, "");
  EXPECT_EQ(c.min_nodes, 1);
  EXPECT_EQ(c.max_nodes, 4);
  EXPECT_EQ(c.rdzv_backend, RdzvBackend::kC10d);
  EXPECT_FALSE(c.node_rank.has_value());
  EXPECT_EQ(c.store_host, "pj-master-0");
  EXPECT_EQ(c.store_port, 23456);
  EXPECT_EQ(c.run_id, "pj");
}

TEST(LaunchConfig, EventLogHandlersAreNullConsoleOrAFile) {
  EXPECT_EQ(parse_event_log_handler("--x", "null").kind, EventLogHandler::Kind::kNull);
  EXPECT_EQ(parse_event_log_handler("--x", "dynamic_rendezvous").kind,
            EventLogHandler::Kind::kNull);
  EXPECT_EQ(parse_event_log_handler("--x", "console").kind, EventLogHandler::Kind::kConsole);
  const auto file = parse_event_log_handler("--x", "file:/tmp/e.jsonl");
  EXPECT_EQ(file.kind, EventLogHandler::Kind::kFile);
  EXPECT_EQ(file.path, "/tmp/e.jsonl");
  try {
    parse_event_log_handler("--event-log-handler", "scuba");
    FAIL() << "expected a ConfigError";
  } catch (const ddp::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("--event-log-handler='scuba'"), std::string::npos);
  }
}

}  // namespace
}  // namespace ddprun
