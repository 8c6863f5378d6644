// The worker environment contract and the failure report / error file.
#include <gtest/gtest.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "config/worker_env.h"
#include "ddp/error.h"
#include "diagnosis/failure_report.h"

namespace ddprun {
namespace {

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(WorkerEnvironment, TheCollectivesHookGoesFirstOnThePythonPath) {
  LaunchConfig config;
  NodeAssignment node{0, 0, 1, 0, 1};
  EXPECT_EQ(worker_environment({}, config, node, {0, ""}, {"h", 1}).count("PYTHONPATH"), 0u);
  config.python_path_prepend = {"/logs/python-hook", "/opt/ddprun/lib/python"};
  EXPECT_EQ(worker_environment({{"PYTHONPATH", "/mine"}}, config, node, {0, ""}, {"h", 1})
                .at("PYTHONPATH"),
            "/logs/python-hook:/opt/ddprun/lib/python:/mine");
  config.python_path_prepend.clear();
  config.python_path_append = {"/opt/ddprun/lib/python"};
  EXPECT_EQ(worker_environment({{"PYTHONPATH", "/mine"}}, config, node, {0, ""}, {"h", 1})
                .at("PYTHONPATH"),
            "/mine:/opt/ddprun/lib/python");
}

TEST(WorkerEnvironment, HasEveryTorchrunVariable) {
  LaunchConfig config;
  config.nproc_per_node = 2;
  config.max_restarts = 3;
  config.run_id = "job";
  config.role = "trainer";
  NodeAssignment node{/*round=*/2, /*group_rank=*/1, /*group_world_size=*/3,
                      /*rank_offset=*/2, /*world_size=*/6};
  const EnvMap agent = {{"PATH", "/bin"}, {"RANK", "9"}, {"NCCL_ASYNC_ERROR_HANDLING", "0"}};
  const EnvMap env =
      worker_environment(agent, config, node, {1, "/logs/1/error.json"}, {"train-0.train", 29500});
  const EnvMap expected = {{"PATH", "/bin"},
                           {"RANK", "3"},
                           {"LOCAL_RANK", "1"},
                           {"WORLD_SIZE", "6"},
                           {"LOCAL_WORLD_SIZE", "2"},
                           {"GROUP_RANK", "1"},
                           {"GROUP_WORLD_SIZE", "3"},
                           {"ROLE_RANK", "3"},
                           {"ROLE_WORLD_SIZE", "6"},
                           {"ROLE_NAME", "trainer"},
                           {"MASTER_ADDR", "train-0.train"},
                           {"MASTER_PORT", "29500"},
                           {"TORCHELASTIC_RESTART_COUNT", "2"},
                           {"TORCHELASTIC_MAX_RESTARTS", "3"},
                           {"TORCHELASTIC_RUN_ID", "job"},
                           {"TORCHELASTIC_USE_AGENT_STORE", "True"},
                           {"TORCHELASTIC_ERROR_FILE", "/logs/1/error.json"},
                           {"TORCHELASTIC_SIGNALS_TO_HANDLE", "SIGTERM,SIGINT,SIGHUP,SIGQUIT"},
                           {"NCCL_ASYNC_ERROR_HANDLING", "0"},
                           {"TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"},
                           {"OMP_NUM_THREADS", "1"}};
  EXPECT_EQ(env, expected);
}

// TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1: worker rank 0 serves the store, as under torchrun.
TEST(WorkerEnvironment, AWorkerHostedStoreIsNotTheAgents) {
  const EnvMap env = worker_environment({}, LaunchConfig{}, {}, {}, {"10.0.0.7", 41234, false});
  EXPECT_EQ(env.at("TORCHELASTIC_USE_AGENT_STORE"), "False");
  EXPECT_EQ(env.at("MASTER_ADDR"), "10.0.0.7");
  EXPECT_EQ(env.at("MASTER_PORT"), "41234");
}

// torchrun 2.10's --virtual-local-rank: every worker is local rank 0 of its own device; its
// other ranks stay real.
TEST(WorkerEnvironment, AVirtualLocalRankIsZeroWithTheWorkersOwnDevice) {
  LaunchConfig config;
  config.nproc_per_node = 3;
  config.virtual_local_rank = true;
  const NodeAssignment node{0, 1, 2, 3, 6};
  const EnvMap env = worker_environment({}, config, node, {2, ""}, {"h", 1});
  EXPECT_EQ(env.at("LOCAL_RANK"), "0");
  EXPECT_EQ(env.at("CUDA_VISIBLE_DEVICES"), "2");
  EXPECT_EQ(env.at("RANK"), "5");
  EXPECT_EQ(env.at("LOCAL_WORLD_SIZE"), "3");
  const EnvMap listed =
      worker_environment({{"CUDA_VISIBLE_DEVICES", "4, 6,7"}}, config, node, {1, ""}, {"h", 1});
  EXPECT_EQ(listed.at("CUDA_VISIBLE_DEVICES"), "6");
  config.virtual_local_rank = false;
  const EnvMap real =
      worker_environment({{"CUDA_VISIBLE_DEVICES", "4,6,7"}}, config, node, {1, ""}, {"h", 1});
  EXPECT_EQ(real.at("LOCAL_RANK"), "1");
  EXPECT_EQ(real.at("CUDA_VISIBLE_DEVICES"), "4,6,7");
}

TEST(WorkerEnvironment, CarriesTheSignalsTheAgentHandles) {
  LaunchConfig config;
  config.signals_to_handle_text = "SIGUSR1,SIGTERM";
  EXPECT_EQ(worker_environment({}, config, {}, {}, {"h", 1}).at("TORCHELASTIC_SIGNALS_TO_HANDLE"),
            "SIGUSR1,SIGTERM");
}

TEST(WorkerEnvironment, KeepsOmpNumThreadsAndSetsItOnlyForSeveralWorkers) {
  LaunchConfig config;
  config.nproc_per_node = 4;
  EXPECT_EQ(worker_environment({{"OMP_NUM_THREADS", "8"}}, config, {}, {}, {"h", 1})
                .at("OMP_NUM_THREADS"),
            "8");
  config.nproc_per_node = 1;
  EXPECT_EQ(worker_environment({}, config, {}, {}, {"h", 1}).count("OMP_NUM_THREADS"), 0u);
}

// --numa-binding's thread count goes to OpenMP, OpenBLAS and MKL; a count the user set in the
// agent's environment wins: OMP_NUM_THREADS for all three (they fall back to it), the others
// each for itself.
TEST(WorkerEnvironment, ThePlansThreadCountUnlessTheUserSetOne) {
  LaunchConfig config;
  config.nproc_per_node = 4;
  const auto threads = [&](const EnvMap& agent, int planned) {
    const EnvMap env = worker_environment(agent, config, {}, {1, "", planned}, {"h", 1});
    std::string seen;
    for (const char* name : {"OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"}) {
      auto it = env.find(name);
      seen += std::string(name) + "=" + (it == env.end() ? "unset" : it->second) + " ";
    }
    return seen;
  };
  EXPECT_EQ(threads({}, 12), "OMP_NUM_THREADS=12 OPENBLAS_NUM_THREADS=12 MKL_NUM_THREADS=12 ");
  EXPECT_EQ(threads({{"OMP_NUM_THREADS", "3"}}, 12),
            "OMP_NUM_THREADS=3 OPENBLAS_NUM_THREADS=unset MKL_NUM_THREADS=unset ");
  EXPECT_EQ(threads({{"OMP_NUM_THREADS", "3"}, {"MKL_NUM_THREADS", "2"}}, 12),
            "OMP_NUM_THREADS=3 OPENBLAS_NUM_THREADS=unset MKL_NUM_THREADS=2 ");
  EXPECT_EQ(threads({{"MKL_NUM_THREADS", "2"}}, 12),
            "OMP_NUM_THREADS=12 OPENBLAS_NUM_THREADS=12 MKL_NUM_THREADS=2 ");
  // No plan: torchrun's rule, OMP_NUM_THREADS=1 for several workers, nothing else.
  EXPECT_EQ(threads({}, 0), "OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=unset MKL_NUM_THREADS=unset ");
  config.nproc_per_node = 1;
  EXPECT_EQ(threads({}, 0),
            "OMP_NUM_THREADS=unset OPENBLAS_NUM_THREADS=unset MKL_NUM_THREADS=unset ");
  EXPECT_EQ(threads({}, 64), "OMP_NUM_THREADS=64 OPENBLAS_NUM_THREADS=64 MKL_NUM_THREADS=64 ");
}

FailureReport sample_report() {
  FailureReport r;
  r.node_rank = 1;
  r.hostname = "train-1";
  r.rank = 3;
  r.local_rank = 1;
  r.pid = 42;
  r.exit_code = 128 + SIGKILL;
  r.signal = SIGKILL;
  r.stderr_tail = {"loading", "boom \"quoted\""};
  r.timestamp = 1700000000;
  return r;
}

TEST(FailureReport, RoundTripsThroughJson) {
  const FailureReport r = sample_report();
  const FailureReport back = FailureReport::from_json(r.to_json());
  EXPECT_EQ(back.to_json(), r.to_json());
  EXPECT_EQ(back.headline(),
            "rank 3 (local rank 1) on node 1 (train-1) was killed by SIGKILL (exit code 137)");
  EXPECT_NE(back.summary().find("    boom \"quoted\""), std::string::npos) << back.summary();
  EXPECT_NE(back.summary().find("2023-11-14T22:13:20Z"), std::string::npos) << back.summary();
  EXPECT_EQ(FailureReport::from_json("not json").kind, "agent");
}

TEST(FailureReport, OnlyACollectiveFailureIsAConsequence) {
  FailureReport r = sample_report();
  EXPECT_FALSE(r.is_consequence());  // killed by SIGKILL: a cause
  r.signal = 0;
  r.exit_code = 70;  // ddp::exit_code::kComm: a peer broke the collective
  EXPECT_TRUE(r.is_consequence());
  r.exit_code = 3;
  EXPECT_FALSE(r.is_consequence());
  r.exit_code = 70;
  r.kind = "agent";
  EXPECT_FALSE(r.is_consequence());
}

TEST(FailureReport, ComposesATorchelasticErrorFile) {
  const std::string path = "/tmp/ddprun-unit-error-" + std::to_string(getpid()) + ".json";
  write_error_file(path, sample_report());
  const std::string text = slurp(path);
  EXPECT_NE(text.find("\"errorCode\": 137"), std::string::npos) << text;
  EXPECT_NE(text.find("\"message\": \"rank 3 (local rank 1) on node 1 (train-1) was killed"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("\"signal\": \"SIGKILL\""), std::string::npos) << text;
  std::filesystem::remove(path);
}

TEST(FailureReport, KeepsTheWorkersOwnErrorFileWithItsExitCode) {
  // What torch.distributed.elastic's @record writes for a Python exception.
  const std::string worker_file = "/tmp/ddprun-unit-worker-" + std::to_string(getpid()) + ".json";
  {
    std::ofstream out(worker_file);
    out << R"({"message": {"message": "RuntimeError: out of data", "extraInfo": )"
        << R"({"py_callstack": "Traceback ...", "timestamp": "1700000000"}}})";
  }
  auto read = read_worker_error_file(worker_file);
  ASSERT_TRUE(read.has_value());
  EXPECT_EQ(read->first, "RuntimeError: out of data");
  FailureReport r = sample_report();
  r.exit_code = 1;
  r.message = read->first;
  r.worker_error_json = read->second;
  const std::string path = worker_file + ".root";
  write_error_file(path, r);
  const std::string text = slurp(path);
  EXPECT_NE(text.find("\"py_callstack\": \"Traceback ...\""), std::string::npos) << text;
  EXPECT_NE(text.find("\"errorCode\": 1"), std::string::npos) << text;
  EXPECT_FALSE(read_worker_error_file("/nonexistent.json").has_value());
  std::filesystem::remove(worker_file);
  std::filesystem::remove(path);
}

TEST(Signals, NamesAndNumbers) {
  EXPECT_EQ(parse_signal("x", "SIGTERM"), SIGTERM);
  EXPECT_EQ(parse_signal("x", "INT"), SIGINT);
  EXPECT_EQ(parse_signal("x", "10"), 10);
  EXPECT_THROW(parse_signal("x", "SIGSTOP"), ddp::ConfigError);
  EXPECT_THROW(parse_signal("x", "99"), ddp::ConfigError);
  EXPECT_EQ(signal_name(SIGKILL), "SIGKILL");
}

}  // namespace
}  // namespace ddprun
