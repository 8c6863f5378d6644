// The example programs as users run them: two ranks of train_mnist as separate processes (on
// generated MNIST-format files), stopped by SIGTERM, resumed; evaluate on the checkpoint; and a
// 2-rank run under ddprun. Every process is bounded by a deadline and killed by PID.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "ddp/exit_codes.h"
#include "ddp/train/checkpoint.h"
#include "multiprocess.h"
#include "test_files.h"

#ifndef TRAIN_MNIST_PATH
#error "TRAIN_MNIST_PATH must name the train_mnist binary"
#endif

namespace ddp {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

struct Process {
  pid_t pid = -1;
  std::string log;
};

// Starts `argv` with extra environment variables, stdout and stderr to `log`.
Process start(const std::vector<std::string>& argv, const std::vector<std::string>& env,
              const std::string& log) {
  std::fflush(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);
    for (const auto& kv : env) putenv(const_cast<char*>(kv.c_str()));
    FILE* out = std::freopen(log.c_str(), "w", stdout);
    if (out == nullptr || dup2(fileno(stdout), STDERR_FILENO) < 0) _exit(127);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  return {pid, log};
}

// Exit code, 128 + signal, or -1 if still running at the deadline (then killed).
int wait_for(Process& p, Clock::time_point deadline) {
  int status = 0;
  while (waitpid(p.pid, &status, WNOHANG) == 0) {
    if (Clock::now() > deadline) {
      kill(-p.pid, SIGKILL);
      waitpid(p.pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(10ms);
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::vector<nlohmann::json> events(const std::string& metrics, const std::string& name) {
  std::vector<nlohmann::json> found;
  std::ifstream in(metrics);
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_discarded() && j["event"] == name) found.push_back(j);
  }
  return found;
}

class TrainMnist : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::write_mnist_split(dir_.path(), "train", 2048, 28, 28, 10, true);
    testing::write_mnist_split(dir_.path(), "t10k", 200, 28, 28, 10, true);
  }

  std::vector<Process> start_ranks(const std::vector<std::string>& flags, int port,
                                   const std::string& tag) {
    std::vector<Process> ranks;
    for (int r = 0; r < 2; ++r) {
      std::vector<std::string> argv{TRAIN_MNIST_PATH, "--data", dir_.path(), "--threads", "1"};
      argv.insert(argv.end(), flags.begin(), flags.end());
      ranks.push_back(start(argv,
                            {"RANK=" + std::to_string(r), "LOCAL_RANK=" + std::to_string(r),
                             "WORLD_SIZE=2", "LOCAL_WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1",
                             "MASTER_PORT=" + std::to_string(port), "DDP_TIMEOUT_SEC=60"},
                            dir_.file(tag + "-rank" + std::to_string(r) + ".log")));
    }
    return ranks;
  }

  testing::TempDir dir_;
};

TEST_F(TrainMnist, SigtermFinishesTheStepCheckpointsAndExitsPreempted) {
  const std::string checkpoints = dir_.file("checkpoints");
  const std::string metrics = dir_.file("metrics.jsonl");
  const std::vector<std::string> flags{"--epochs",     "50",    "--checkpoint-dir", checkpoints,
                                       "--metrics",    metrics, "--log-every",      "1",
                                       "--batch-size", "16"};
  auto ranks = start_ranks(flags, testing::free_tcp_port(), "first");
  const auto deadline = Clock::now() + 120s;
  // Wait until training is under way, then signal rank 1 only: rank 0 must stop with it.
  while (events(metrics, "step").size() < 3 && Clock::now() < deadline) {
    std::this_thread::sleep_for(20ms);
  }
  ASSERT_GE(events(metrics, "step").size(), 3u) << read_text(ranks[0].log);
  kill(ranks[1].pid, SIGTERM);
  for (auto& r : ranks) {
    EXPECT_EQ(wait_for(r, deadline), exit_code::kPreempted) << read_text(r.log);
  }
  const auto ends = events(metrics, "end");
  ASSERT_EQ(ends.size(), 1u);
  EXPECT_EQ(ends[0]["status"], "preempted");
  const int64_t stopped_at = ends[0]["step"];
  const auto latest = train::CheckpointDirectory(checkpoints, 3).latest_valid();
  ASSERT_TRUE(latest.has_value());
  EXPECT_EQ(train::read_checkpoint_meta(*latest).global_step, stopped_at);

  // Rerunning the same command resumes from that step (two more steps, then done).
  std::vector<std::string> again = flags;
  again.insert(again.end(), {"--max-steps", std::to_string(stopped_at + 2)});
  auto resumed = start_ranks(again, testing::free_tcp_port(), "second");
  for (auto& r : resumed) {
    EXPECT_EQ(wait_for(r, Clock::now() + 120s), 0) << read_text(r.log);
  }
  const auto starts = events(metrics, "start");
  ASSERT_EQ(starts.size(), 2u);
  EXPECT_EQ(starts[1]["start_step"], stopped_at);
  EXPECT_EQ(events(metrics, "end").back()["step"], stopped_at + 2);
}

TEST_F(TrainMnist, EvaluateReadsTheCheckpoint) {
  const std::string checkpoints = dir_.file("checkpoints");
  auto ranks = start_ranks({"--epochs", "1", "--train-subset", "256", "--checkpoint-dir",
                            checkpoints, "--log-every", "0"},
                           testing::free_tcp_port(), "train");
  for (auto& r : ranks) EXPECT_EQ(wait_for(r, Clock::now() + 120s), 0) << read_text(r.log);
  Process eval = start({EVALUATE_PATH, "--checkpoint", checkpoints, "--data", dir_.path(),
                        "--dataset", "mnist", "--threads", "1"},
                       {}, dir_.file("evaluate.log"));
  ASSERT_EQ(wait_for(eval, Clock::now() + 60s), 0) << read_text(eval.log);
  const std::string out = read_text(eval.log);
  EXPECT_NE(out.find("overall"), std::string::npos) << out;
  EXPECT_NE(out.find("200"), std::string::npos) << out;  // the whole test split
}

TEST_F(TrainMnist, BadDataDirectoryExitsWithTheDataCode) {
  Process p = start({TRAIN_MNIST_PATH, "--data", dir_.file("nowhere")}, {}, dir_.file("bad.log"));
  EXPECT_EQ(wait_for(p, Clock::now() + 60s), exit_code::kData);
  EXPECT_NE(read_text(p.log).find("nowhere/train-images-idx3-ubyte[.gz]"), std::string::npos);
  Process q = start({TRAIN_MNIST_PATH, "--epochs", "zero"}, {}, dir_.file("flag.log"));
  EXPECT_EQ(wait_for(q, Clock::now() + 60s), exit_code::kConfig);
}

// The straggler threshold is a ratio to the median above 1, from the flag or the setting.
TEST_F(TrainMnist, AStragglerThresholdOfOneOrLessExitsWithTheConfigCode) {
  Process p = start({TRAIN_MNIST_PATH, "--data", dir_.path(), "--straggler-threshold", "1"}, {},
                    dir_.file("threshold.log"));
  EXPECT_EQ(wait_for(p, Clock::now() + 60s), exit_code::kConfig);
  EXPECT_NE(read_text(p.log).find("the straggler threshold must be above 1"), std::string::npos)
      << read_text(p.log);
  Process q = start({TRAIN_MNIST_PATH, "--data", dir_.path()}, {"DDP_STRAGGLER_PERCENT=100"},
                    dir_.file("percent.log"));
  EXPECT_EQ(wait_for(q, Clock::now() + 60s), exit_code::kConfig);
  EXPECT_NE(read_text(q.log).find("DDP_STRAGGLER_PERCENT"), std::string::npos) << read_text(q.log);
}

// The launcher's error file names the worker's own exception, not a guess from its stderr.
TEST_F(TrainMnist, UnderDdprunTheErrorFileCarriesTheTrainersException) {
  const std::string error_file = dir_.file("error.json");
  Process p = start({DDPRUN_PATH, "--standalone", "--nproc-per-node", "2", TRAIN_MNIST_PATH,
                     "--data", dir_.file("nowhere")},
                    {"TORCHELASTIC_ERROR_FILE=" + error_file}, dir_.file("ddprun-bad.log"));
  EXPECT_EQ(wait_for(p, Clock::now() + 120s), exit_code::kData) << read_text(p.log);
  const auto doc = nlohmann::json::parse(read_text(error_file), nullptr, false);
  ASSERT_TRUE(doc.is_object()) << read_text(error_file);
  const std::string message = doc["message"]["message"].get<std::string>();
  EXPECT_EQ(message.rfind("DataError: ", 0), 0u) << message;
  EXPECT_NE(message.find("nowhere/train-images-idx3-ubyte[.gz]"), std::string::npos) << message;
  EXPECT_EQ(doc["message"]["errorCode"], exit_code::kData) << doc.dump();
}

// No launcher: Open MPI's mpirun (Debian's openmpi-bin) starts two ranks, which take their place
// from OMPI_COMM_WORLD_* (rank 0 hosts the store) and train together.
TEST_F(TrainMnist, MpirunStartsTwoRanksWithNoLauncher) {
  if (access("/usr/bin/mpirun", X_OK) != 0) {
    GTEST_SKIP() << "/usr/bin/mpirun is missing; install openmpi-bin (scripts/install-deps)";
  }
  const int port = testing::free_tcp_port();
  Process p = start({"/usr/bin/mpirun",
                     "--allow-run-as-root",
                     "--oversubscribe",
                     "-np",
                     "2",
                     "-x",
                     "MASTER_PORT=" + std::to_string(port),
                     "-x",
                     "DDP_TIMEOUT_SEC=60",
                     TRAIN_MNIST_PATH,
                     "--data",
                     dir_.path(),
                     "--epochs",
                     "1",
                     "--train-subset",
                     "512",
                     "--threads",
                     "1",
                     "--checkpoint-dir",
                     dir_.file("mpi-ckpt")},
                    {}, dir_.file("mpirun.log"));
  ASSERT_EQ(wait_for(p, Clock::now() + 120s), 0) << read_text(p.log);
  const std::string out = read_text(p.log);
  for (int r : {0, 1}) {
    EXPECT_NE(out.find("joined as rank " + std::to_string(r) + "/2 (local " + std::to_string(r) +
                       "/2), master 127.0.0.1:" + std::to_string(port) + ", from Open MPI"),
              std::string::npos)
        << out;
  }
  EXPECT_NE(out.find("epoch 1/1: train loss"), std::string::npos) << out;
}

TEST_F(TrainMnist, TwoRanksUnderDdprun) {
  Process p = start({DDPRUN_PATH, "--standalone", "--nproc-per-node", "2", TRAIN_MNIST_PATH,
                     "--data", dir_.path(), "--epochs", "1", "--train-subset", "512"},
                    {}, dir_.file("ddprun.log"));
  ASSERT_EQ(wait_for(p, Clock::now() + 120s), 0) << read_text(p.log);
  const std::string out = read_text(p.log);
  EXPECT_NE(out.find("test accuracy"), std::string::npos) << out;
}

// --trace-steps under ddprun: the ranks' traces become one file with a track per rank.
TEST_F(TrainMnist, DdprunMergesTheRanksTimelines) {
  Process p = start({DDPRUN_PATH, "--standalone", "--nproc-per-node", "2", TRAIN_MNIST_PATH,
                     "--data", dir_.path(), "--epochs", "1", "--train-subset", "512", "--threads",
                     "1", "--trace-steps", "2:3", "--bucket-cap-mb", "0.1"},
                    {"TMPDIR=" + dir_.path()}, dir_.file("ddprun-trace.log"));
  ASSERT_EQ(wait_for(p, Clock::now() + 120s), 0) << read_text(p.log);
  const std::string out = read_text(p.log);
  const std::string marker = "timeline of 2 ranks: ";
  const auto at = out.find(marker);
  ASSERT_NE(at, std::string::npos) << out;
  const std::string path =
      out.substr(at + marker.size(), out.find(' ', at + marker.size()) - (at + marker.size()));
  const auto doc = nlohmann::json::parse(read_text(path), nullptr, false);
  ASSERT_TRUE(doc.is_object()) << path;
  std::map<int, std::set<std::string>> names;  // rank -> span names
  for (const auto& e : doc["traceEvents"]) {
    if (e["ph"] == "X") names[e["pid"].get<int>()].insert(e["name"].get<std::string>());
  }
  ASSERT_EQ(names.size(), 2u) << doc.dump().substr(0, 2000);
  for (const auto& [rank, spans] : names) {
    for (const char* name : {"data wait", "forward", "backward", "optimizer step"}) {
      EXPECT_EQ(spans.count(name), 1u) << name << " on rank " << rank;
    }
    EXPECT_TRUE(
        std::any_of(spans.begin(), spans.end(),
                    [](const std::string& n) { return n.rfind("allreduce bucket", 0) == 0; }))
        << "rank " << rank;
  }
}

}  // namespace
}  // namespace ddp
