// The trainer across real ranks: resuming from a checkpoint continues exactly as an uninterrupted
// run, sharded evaluation equals evaluation in one process, the schedule, and option checks.
#include <signal.h>
#include <torch/torch.h>
#include <filesystem>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "ddp/distributed.h"
#include "ddp/error.h"
#include "ddp/models/classifier.h"
#include "ddp/models/model_spec.h"
#include "ddp/train/checkpoint.h"
#include "ddp/train/evaluation.h"
#include "ddp/train/lr_schedule.h"
#include "ddp/train/trainer.h"
#include "multiprocess.h"
#include "test_files.h"

namespace ddp::train {
namespace {

using namespace std::chrono_literals;
using testing::require;

// 12x12 one-channel images whose label is learnable from the pixels.
data::ImageDataset synthetic(int64_t n, uint64_t seed) {
  auto gen = at::detail::createCPUGenerator(seed);
  data::ImageDataset d;
  d.labels = torch::randint(0, 4, {n}, gen);
  d.images = (torch::rand({n, 1, 12, 12}, gen) * 80).to(torch::kByte);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t label = d.labels[i].item<int64_t>();
    d.images[i][0].narrow(0, 3 * label, 3).fill_(255);  // a bright band per class
  }
  d.class_names = {"zero", "one", "two", "three"};
  return d;
}

TrainerOptions small_options(const std::string& checkpoint_dir) {
  TrainerOptions o;
  o.epochs = 2;
  o.data.batch_size = 8;
  o.data.transform.mean = {0.3f};
  o.data.transform.std = {0.3f};
  o.data.transform.random_crop_flip = true;  // augmentation must resume exactly too
  o.data.transform.crop_padding = 1;
  o.optimizer.lr = 0.05;
  o.seed = 7;
  o.checkpoint_dir = checkpoint_dir;
  o.log_every = 0;
  o.handle_signals = false;
  return o;
}

std::vector<at::Tensor> parameters_of(models::Classifier& m) {
  std::vector<at::Tensor> out;
  for (auto& p : m.parameters()) out.push_back(p.detach().clone());
  return out;
}

// Runs `body` on `ranks` gloo ranks (one intra-op thread each, a 30 s op timeout, 120 s in
// all); true when every rank succeeded.
bool on_ranks(int ranks, const std::function<void(Communicator&)>& body) {
  testing::TestStoreServer server;
  CommOptions comm_options;
  comm_options.timeout = 30s;
  auto outcomes = testing::run_with_communicators(server, "gloo", ranks, comm_options, 120s,
                                                  [&](Communicator& comm) {
                                                    torch::set_num_threads(1);
                                                    body(comm);
                                                  });
  return testing::all_ranks_succeeded(outcomes);
}

bool on_two_ranks(const std::function<void(Communicator&)>& body) { return on_ranks(2, body); }

// A run interrupted at step 4 and resumed by a fresh trainer with fresh weights ends with the
// weights of an uninterrupted run. `per_rank`: each rank has a checkpoint directory of its own
// (a volume per pod), so rank 1 has none and takes the state rank 0 sends.
// `per_rank`: each rank checkpoints to a folder of its own (a volume per pod), and the folder of
// rank `wiped` is emptied before the resume (its pod was replaced, with a fresh emptyDir).
void expect_resumed_run_equals_uninterrupted_run(bool per_rank, int wiped = -1) {
  testing::TempDir dir;
  EXPECT_TRUE(on_two_ranks([&](Communicator& comm) {
    const auto train_set = synthetic(96, 1);  // 6 steps per epoch per rank at batch 8
    const auto test_set = synthetic(40, 2);
    const models::ModelSpec spec{"mnist_cnn", 1, 12, 12, 4};

    auto whole = models::create_model(spec, 11);
    const TrainResult a =
        Trainer(comm, whole, train_set, test_set, small_options(dir.file("a"))).fit();
    require(a.global_step == 12, "uninterrupted run took " + std::to_string(a.global_step));
    std::set<int64_t> steps;
    const auto written = CheckpointDirectory(dir.file("a"), 3).list();
    for (const auto& path : written) steps.insert(CheckpointDirectory::step_of(path).value_or(-1));
    require(!written.empty() && steps.size() == written.size(),
            "a shared folder holds one checkpoint per step (one writer)");

    const std::string b =
        per_rank ? dir.file("b-rank" + std::to_string(comm.rank())) : dir.file("b");
    TrainerOptions first = small_options(b);
    first.max_steps = 4;
    auto part = models::create_model(spec, 11);
    const TrainResult b1 = Trainer(comm, part, train_set, test_set, first).fit();
    require(b1.global_step == 4, "first part ended at " + std::to_string(b1.global_step));
    if (per_rank) {
      require(!CheckpointDirectory(b, 3).list().empty(), "each volume gets the checkpoints");
      comm.barrier();
      if (comm.rank() == wiped) std::filesystem::remove_all(b);
    }
    auto resumed = models::create_model(spec, 99);
    const TrainResult b2 = Trainer(comm, resumed, train_set, test_set, small_options(b)).fit();
    require(b2.resumed_from_step == 4, "resumed from " + std::to_string(b2.resumed_from_step));
    const int from = wiped < 0 ? -1 : 1 - wiped;
    require(b2.state_from_rank == from, "state from rank " + std::to_string(b2.state_from_rank));
    require(b2.global_step == 12, "resumed run ended at " + std::to_string(b2.global_step));

    const auto pa = parameters_of(*whole);
    const auto pb = parameters_of(*resumed);
    for (std::size_t i = 0; i < pa.size(); ++i) {
      require(torch::equal(pa[i], pb[i]),
              "parameter " + std::to_string(i) + " differs by " +
                  std::to_string((pa[i] - pb[i]).abs().max().item<double>()));
    }
    // The model learned something real (evaluated on held-out data).
    require(!a.epochs.empty() && a.epochs.back().evaluated && a.epochs.back().eval.accuracy() > 0.6,
            "accuracy after training is too low");
  }));
}

TEST(Trainer, ResumedRunEqualsUninterruptedRun) {
  expect_resumed_run_equals_uninterrupted_run(/*per_rank=*/false);
}

TEST(Trainer, EachVolumeHoldsTheCheckpointsSoAnyRankResumesFromItsOwn) {
  expect_resumed_run_equals_uninterrupted_run(/*per_rank=*/true);
}

TEST(Trainer, ARankWithoutTheCheckpointTakesTheStateFromThePeerThatHasIt) {
  expect_resumed_run_equals_uninterrupted_run(/*per_rank=*/true, /*wiped=*/1);
}

TEST(Trainer, WhenRankZerosVolumeIsLostTheStateComesFromTheOtherVolume) {
  expect_resumed_run_equals_uninterrupted_run(/*per_rank=*/true, /*wiped=*/0);
}

TEST(Trainer, ARankThatCannotWriteItsCheckpointFolderFailsEveryRankAtOnce) {
  // Rank 1's folder lies under a regular file (even root cannot create it): both ranks fail
  // with a DataError that says so. A rank left waiting in a collective would fail with the
  // op timeout's CommError instead.
  testing::TempDir dir;
  std::ofstream(dir.file("a-file")) << "x";
  EXPECT_TRUE(on_two_ranks([&](Communicator& comm) {
    const auto train_set = synthetic(32, 1);
    const auto test_set = synthetic(8, 2);
    auto model = models::create_model({"mnist_cnn", 1, 12, 12, 4}, 11);
    const std::string where = comm.rank() == 1 ? dir.file("a-file/ckpt") : dir.file("ckpt");
    try {
      Trainer(comm, model, train_set, test_set, small_options(where)).fit();
      require(false, "trained without a writable checkpoint folder");
    } catch (const DataError& e) {
      const std::string expected =
          comm.rank() == 1 ? "cannot write in the checkpoint directory" : "another rank cannot";
      require(std::string(e.what()).find(expected) != std::string::npos, e.what());
    }
  }));
}

// A classifier without dropout or batch statistics, so that the same samples in other groupings
// give the same gradients.
class LinearClassifier : public models::Classifier {
 public:
  explicit LinearClassifier(const models::ModelSpec& spec) : Classifier(spec) {
    torch::manual_seed(5);
    fc_ = register_module("fc", torch::nn::Linear(spec.height * spec.width, spec.num_classes));
  }
  at::Tensor forward(const at::Tensor& images) override { return fc_->forward(images.flatten(1)); }

 private:
  torch::nn::Linear fc_{nullptr};
};

TEST(Trainer, KeepGlobalBatchAccumulatesToTheStartingWorldsSteps) {
  // 2 ranks train 2 steps and checkpoint; the job shrinks to 1 rank. With keep_global_batch, the
  // one rank accumulates 2 micro-batches of 8 per optimizer step: the same 16 samples, the same
  // mean gradient and the same rate as each step of the 2 ranks that go on instead. Without it,
  // it takes twice the steps at half the rate, and the weights differ.
  testing::TempDir dir;
  const auto train_set = synthetic(96, 1);  // 6 steps per epoch at 2 ranks x 8
  const auto test_set = synthetic(16, 2);
  const models::ModelSpec spec{"linear_test", 1, 12, 12, 4};
  const auto options = [&](const std::string& where) {
    TrainerOptions o = small_options(dir.file(where));
    o.epochs = 1;
    o.data.transform.random_crop_flip = false;
    o.evaluate_each_epoch = false;
    return o;
  };
  const auto run = [&](int ranks, const std::string& where, int64_t max_steps, bool keep,
                       const std::string& params_file) {
    return on_ranks(ranks, [&](Communicator& comm) {
      TrainerOptions o = options(where);
      o.max_steps = max_steps;
      o.keep_global_batch = keep;
      auto model = std::make_shared<LinearClassifier>(spec);
      const TrainResult r = Trainer(comm, model, train_set, test_set, o).fit();
      if (comm.rank() == 0 && !params_file.empty()) {
        std::vector<at::Tensor> params = parameters_of(*model);
        torch::save(params, params_file);
        std::ofstream(params_file + ".steps") << r.global_step;
      }
    });
  };
  ASSERT_TRUE(run(2, "two", 2, false, ""));
  for (const char* copy : {"kept", "scaled"}) {
    ASSERT_EQ(std::system(("cp -r " + dir.file("two") + " " + dir.file(copy)).c_str()), 0);
  }
  ASSERT_TRUE(run(2, "two", 0, false, dir.file("two.pt")));
  ASSERT_TRUE(run(1, "kept", 0, true, dir.file("kept.pt")));
  ASSERT_TRUE(run(1, "scaled", 0, false, dir.file("scaled.pt")));
  const auto load = [&](const std::string& name) {
    std::vector<at::Tensor> params;
    torch::load(params, dir.file(name));
    return params;
  };
  const auto steps = [&](const std::string& name) {
    int64_t n = -1;
    std::ifstream(dir.file(name + ".steps")) >> n;
    return n;
  };
  EXPECT_EQ(steps("two.pt"), 6);
  EXPECT_EQ(steps("kept.pt"), 6);     // 2 before the change, then 4 groups of 2 micro-batches
  EXPECT_EQ(steps("scaled.pt"), 10);  // 2, then 8 steps of 8 images
  const auto two = load("two.pt");
  const auto kept = load("kept.pt");
  const auto scaled = load("scaled.pt");
  double kept_diff = 0;
  double scaled_diff = 0;
  for (std::size_t i = 0; i < two.size(); ++i) {
    kept_diff = std::max(kept_diff, (two[i] - kept[i]).abs().max().item<double>());
    scaled_diff = std::max(scaled_diff, (two[i] - scaled[i]).abs().max().item<double>());
  }
  EXPECT_LT(kept_diff, 1e-5);
  EXPECT_GT(scaled_diff, 1e-3);
}

// The "ranks" records of a metrics file: each rank's compute per step, and the stragglers named.
struct RanksRecord {
  std::vector<double> compute_ms;
  std::vector<double> stragglers;
};
std::vector<RanksRecord> ranks_records(const std::string& path) {
  std::vector<RanksRecord> records;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    const auto json = nlohmann::json::parse(line);
    if (json.at("event") != "ranks") continue;
    records.push_back({json.at("compute_ms").get<std::vector<double>>(),
                       json.at("stragglers").get<std::vector<double>>()});
  }
  return records;
}

// 24 steps of 2 ranks with straggler reports every 8; `delay_ms[r]` slows rank r's every step.
std::vector<RanksRecord> run_with_step_delays(const std::vector<int>& delay_ms,
                                              const std::string& metrics) {
  EXPECT_TRUE(on_two_ranks([&](Communicator& comm) {
    ::setenv("DDP_TEST_STEP_DELAY_MS", std::to_string(delay_ms[comm.rank()]).c_str(), 1);
    TrainerOptions o = small_options("");
    o.epochs = 4;  // 6 steps each
    o.evaluate_each_epoch = false;
    o.metrics_path = metrics;
    o.straggler_window = 8;
    auto model = models::create_model({"mnist_cnn", 1, 12, 12, 4}, 11);
    const TrainResult result = Trainer(comm, model, synthetic(96, 1), synthetic(8, 2), o).fit();
    require(result.global_step == 24, "ran " + std::to_string(result.global_step) + " steps");
  }));
  return ranks_records(metrics);
}

TEST(Trainer, NamesTheRankThatComputesSlower) {
  testing::TempDir dir;
  const auto records = run_with_step_delays({0, 60}, dir.file("metrics.jsonl"));
  ASSERT_EQ(records.size(), 3u) << "a report every 8 of 24 steps";
  for (const auto& record : records) {
    ASSERT_EQ(record.compute_ms.size(), 2u);
    // Rank 1 computes 60 ms longer each step; rank 0 waits for it instead, which is not compute.
    EXPECT_GT(record.compute_ms[1], record.compute_ms[0] + 50) << record.compute_ms[0];
    EXPECT_EQ(record.stragglers, std::vector<double>{1.0});
  }
}

TEST(Trainer, NamesNoRankWhenTheyComputeAlike) {
  testing::TempDir dir;
  // Both slowed alike, so that a few milliseconds of this machine's noise are no ratio of 1.2.
  const auto records = run_with_step_delays({60, 60}, dir.file("metrics.jsonl"));
  ASSERT_EQ(records.size(), 3u);
  for (const auto& record : records) {
    EXPECT_GT(record.compute_ms[0], 55.0);
    EXPECT_GT(record.compute_ms[1], 55.0);
    EXPECT_TRUE(record.stragglers.empty())
        << record.compute_ms[0] << " vs " << record.compute_ms[1] << " ms/step";
  }
}

// --trace-steps: each rank's Chrome trace of the traced steps, whose bucket allreduces (on the
// collectives track) start while backward still runs.
TEST(Trainer, TracesTheStepsWithBucketAllreducesOverlappingBackward) {
  testing::TempDir dir;
  ASSERT_TRUE(on_two_ranks([&](Communicator& comm) {
    TrainerOptions o = small_options("");
    o.epochs = 1;
    o.evaluate_each_epoch = false;
    o.trace_steps = "3:4";
    o.trace_dir = dir.path();
    // Small buckets: several per step, the first ones complete early in backward.
    o.ddp.first_bucket_cap_bytes = 8 << 10;
    o.ddp.bucket_cap_bytes = 8 << 10;
    auto model = models::create_model({"mnist_cnn", 1, 12, 12, 4}, 11);
    Trainer(comm, model, synthetic(96, 1), synthetic(8, 2), o).fit();
  }));
  for (int rank : {0, 1}) {
    std::ifstream in(dir.file("trace-rank" + std::to_string(rank) + ".json"));
    const auto doc = nlohmann::json::parse(in, nullptr, false);
    ASSERT_TRUE(doc.is_object()) << "rank " << rank;
    std::map<int64_t, std::pair<double, double>> backward;  // step -> [start, end)
    std::vector<nlohmann::json> buckets;
    std::set<std::string> names;
    for (const auto& e : doc["traceEvents"]) {
      if (e["ph"] != "X") continue;
      EXPECT_EQ(e["pid"], rank);
      const int64_t step = e["args"]["step"];
      EXPECT_TRUE(step == 3 || step == 4) << e.dump();
      const std::string name = e["name"];
      names.insert(name);
      const double ts = e["ts"];
      if (name == "backward") backward[step] = {ts, ts + e["dur"].get<double>()};
      if (name.rfind("allreduce bucket", 0) == 0) buckets.push_back(e);
    }
    for (const char* name :
         {"data wait", "forward", "backward", "optimizer step", "allreduce stopvote"}) {
      EXPECT_EQ(names.count(name), 1u) << name << " on rank " << rank;
    }
    ASSERT_EQ(backward.size(), 2u);
    int overlapping = 0;
    for (const auto& b : buckets) {
      const auto& [start, end] = backward.at(b["args"]["step"].get<int64_t>());
      if (b["ts"].get<double>() > start && b["ts"].get<double>() < end) ++overlapping;
    }
    EXPECT_GE(overlapping, 2) << "of " << buckets.size() << " bucket allreduces on rank " << rank;
  }
}

TEST(Trainer, ShardedEvaluationEqualsOneProcess) {
  testing::TestStoreServer server;
  CommOptions comm_options;
  comm_options.timeout = 30s;
  auto outcomes = testing::run_with_communicators(
      server, "gloo", 3, comm_options, 60s, [&](Communicator& comm) {
        torch::set_num_threads(1);
        const auto test_set = synthetic(101, 3);  // not a multiple of 3: no sample twice
        auto model = models::create_model({"mnist_cnn", 1, 12, 12, 4}, 5);
        EvalOptions options;
        options.batch_size = 16;
        options.transform.mean = {0.3f};
        options.transform.std = {0.3f};
        const EvalResult sharded = evaluate(*model, test_set, options, &comm);
        const EvalResult alone = evaluate(*model, test_set, options, nullptr);
        require(sharded.count() == 101,
                "sharded evaluation saw " + std::to_string(sharded.count()) + " samples");
        require(sharded.correct == alone.correct && sharded.total == alone.total,
                "per-class counts differ");
        require(std::abs(sharded.loss_sum - alone.loss_sum) < 1e-3 * alone.loss_sum,
                "loss differs");
      });
  EXPECT_TRUE(testing::all_ranks_succeeded(outcomes));
}

TEST(Evaluation, AccuracyTableHasARowPerClassAndOverall) {
  EvalResult r;
  r.correct = {9, 5};
  r.total = {10, 10};
  const std::string table = format_accuracy_table(r, {"cat", "dog"});
  EXPECT_NE(table.find("cat             9        10    90.00%"), std::string::npos) << table;
  EXPECT_NE(table.find("overall        14        20    70.00%"), std::string::npos) << table;
  EXPECT_DOUBLE_EQ(r.accuracy(), 0.7);
}

TEST(LrSchedule, WarmupCosineAndStep) {
  const LrSchedule cosine(0.1, 100, 10, {"cosine", 10, 0.1, 30, 0.0});
  EXPECT_NEAR(cosine.at(0), 0.01, 1e-12);  // warm-up starts at base / warmup
  EXPECT_NEAR(cosine.at(9), 0.1, 1e-12);
  EXPECT_NEAR(cosine.at(10), 0.1, 1e-12);
  EXPECT_NEAR(cosine.at(55), 0.05, 1e-12);
  EXPECT_NEAR(cosine.at(100), 0.0, 1e-12);
  const LrSchedule step(1.0, 100, 10, {"step", 0, 0.5, 2, 0.0});
  EXPECT_DOUBLE_EQ(step.at(19), 1.0);
  EXPECT_DOUBLE_EQ(step.at(20), 0.5);
  EXPECT_DOUBLE_EQ(step.at(45), 0.25);
  EXPECT_THROW(LrSchedule(0.1, 10, 1, {"linear", 0, 0.1, 1, 0}), ConfigError);
}

TEST(Trainer, RejectsAModelBuiltForOtherData) {
  testing::TestStoreServer server;
  auto outcomes = testing::run_with_communicators(
      server, "gloo", 1, CommOptions{}, 30s, [&](Communicator& comm) {
        auto model = models::create_model({"mnist_cnn", 1, 28, 28, 10});
        try {
          Trainer(comm, model, synthetic(8, 1), synthetic(8, 2), small_options(""));
        } catch (const ConfigError& e) {
          require(std::string(e.what()).find("built for 1x28x28 images and 10 classes") !=
                      std::string::npos,
                  e.what());
          return;
        }
        throw std::runtime_error("no error");
      });
  EXPECT_TRUE(testing::all_ranks_succeeded(outcomes));
}

// --- In-process regrouping (ddp/distributed.h) ------------------------------------------------
// Forked processes play the workers and, in the last one, ddprun's agent: the notice in each
// worker's DDP_ABORT_FILE, the answer in <DDP_REGROUP_FILE>.ready, the place in DDP_REGROUP_FILE
// (launcher/supervision/regroup_offer.h).

constexpr auto kRegroupDeadline = 150s;

std::string worker_file(const testing::TempDir& dir, const char* what, int worker) {
  return dir.file(std::string(what) + "-" + std::to_string(worker));
}

void write_now(const std::string& path, const std::string& text) {
  std::ofstream(path + ".partial") << text;
  std::filesystem::rename(path + ".partial", path);
}

void wait_for(const std::string& path) {
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  while (!std::filesystem::exists(path)) {
    require(std::chrono::steady_clock::now() < deadline, "no " + path + " within 60 s");
    std::this_thread::sleep_for(10ms);
  }
}

std::string place(int rank, int world, int port, int round) {
  return fmt::format(
      "RANK={}\nLOCAL_RANK={}\nWORLD_SIZE={}\nLOCAL_WORLD_SIZE={}\nMASTER_ADDR=127.0.0.1\n"
      "MASTER_PORT={}\nTORCHELASTIC_USE_AGENT_STORE=1\nTORCHELASTIC_RESTART_COUNT={}\n",
      rank, rank, world, world, port, round);
}

// A worker's environment as ddprun gives it (a place, and the two files), set in the child.
void set_worker_env(const testing::TempDir& dir, int worker, const std::string& where,
                    int timeout_sec) {
  std::istringstream lines(where);
  for (std::string line; std::getline(lines, line);) {
    const auto eq = line.find('=');
    setenv(line.substr(0, eq).c_str(), line.substr(eq + 1).c_str(), 1);
  }
  setenv("DDP_ABORT_FILE", worker_file(dir, "abort", worker).c_str(), 1);
  setenv("DDP_REGROUP_FILE", worker_file(dir, "regroup", worker).c_str(), 1);
  setenv("DDP_REGROUP_WAIT_SEC", "0", 1);
  setenv("DDP_TIMEOUT_SEC", std::to_string(timeout_sec).c_str(), 1);
  setenv("DDP_TEST_STEP_DELAY_MS", "100", 1);  // ~1.2 s per epoch: the notice comes mid-run
}

// A worker at `where` joins its group.
// `timeout_sec`: the collectives' (DDP_TIMEOUT_SEC).
ProcessGroup start_worker(const testing::TempDir& dir, int worker, const std::string& where,
                          int timeout_sec = 60) {
  set_worker_env(dir, worker, where, timeout_sec);
  torch::set_num_threads(1);
  return init_process_group();
}

// The agent's part of a regroup of `workers`, once they offer it, into places[i] (empty: that
// worker is gone).
void agent_regroups(const testing::TempDir& dir, const std::vector<int>& workers,
                    const std::string& notice, const std::vector<std::string>& places) {
  for (int w : workers) wait_for(worker_file(dir, "regroup", w) + ".able");
  for (int w : workers) write_now(worker_file(dir, "abort", w), notice + "\n");
  for (int w : workers) wait_for(worker_file(dir, "regroup", w) + ".ready");
  for (std::size_t i = 0; i < workers.size(); ++i) {
    std::filesystem::remove(worker_file(dir, "abort", workers[i]));
    if (!places[i].empty()) write_now(worker_file(dir, "regroup", workers[i]), places[i]);
  }
}

// Once both ranks train, rank 1's process (its pid from its offer) gets `sig`; returns the pid.
pid_t signal_rank_one_mid_run(const testing::TempDir& dir, int sig) {
  for (int w : {0, 1}) wait_for(worker_file(dir, "regroup", w) + ".able");
  std::this_thread::sleep_for(500ms);
  std::ifstream able(worker_file(dir, "regroup", 1) + ".able");
  pid_t pid = 0;
  able >> pid;
  require(pid > 0 && kill(pid, sig) == 0, "could not signal rank 1");
  return pid;
}

TrainerOptions regroup_options() {
  TrainerOptions o = small_options("");
  o.data.transform.random_crop_flip = false;
  return o;
}

const models::ModelSpec kSpec{"mnist_cnn", 1, 12, 12, 4};

TEST(Regroup, AtAStepBoundaryIntoTheSameWorldEndsAsTheUninterruptedRun) {
  // Both ranks stop after the same step, join a new world of the same two ranks (a new store
  // round, a new communicator) and go on from memory: the weights end exactly as without it.
  testing::TempDir dir;
  testing::TestStoreServer server;
  const int port = server.port();
  auto outcomes = testing::run_ranks(3, kRegroupDeadline, [&](int who) {
    if (who == 2) {
      agent_regroups(dir, {0, 1}, "regroup after step: a test's node joins",
                     {place(0, 2, port, 1001), place(1, 2, port, 1001)});
      return;
    }
    ProcessGroup group = start_worker(dir, who, place(who, 2, port, 1000));
    const auto train_set = synthetic(96, 1);
    const auto test_set = synthetic(40, 2);
    auto whole = models::create_model(kSpec, 11);
    Trainer(*group.comm, whole, train_set, test_set, regroup_options()).fit();
    auto regrouped = models::create_model(kSpec, 11);
    const TrainResult r = Trainer(group, regrouped, train_set, test_set, regroup_options()).fit();
    require(r.regroups == 1, "regroups: " + std::to_string(r.regroups));
    require(r.global_step == 12, "ended at step " + std::to_string(r.global_step));
    require(group.env.restart_count == 1001, "the new world is round 1001");
    const auto pa = parameters_of(*whole);
    const auto pb = parameters_of(*regrouped);
    for (std::size_t i = 0; i < pa.size(); ++i) {
      require(torch::equal(pa[i], pb[i]), "parameter " + std::to_string(i) + " differs");
    }
  });
  EXPECT_TRUE(testing::all_ranks_succeeded(outcomes));
}

// The sum of every parameter of every rank, which must agree (one world, one model).
void require_same_model_everywhere(Communicator& comm, models::Classifier& model) {
  double sum = 0;
  for (const auto& p : parameters_of(model)) sum += p.sum().item<double>();
  std::vector<double> mine{sum};
  std::vector<double> all(static_cast<std::size_t>(comm.size()));
  comm.allgather(mine, all);
  for (double s : all) require(s == sum, "the ranks' models differ after the regroup");
}

TEST(Regroup, AJoinerTakesTheStateFromAPeersMemoryAndNoCheckpointExists) {
  // Two ranks train; a third process joins at a step boundary and gets the model, optimizer and
  // position from rank 0's memory by broadcast. There is no checkpoint folder at all.
  testing::TempDir dir;
  testing::TestStoreServer server;
  const int port = server.port();
  auto outcomes = testing::run_ranks(4, kRegroupDeadline, [&](int who) {
    if (who == 3) {
      agent_regroups(dir, {0, 1}, "regroup after step: 1 node waiting to join",
                     {place(0, 3, port, 2001), place(1, 3, port, 2001)});
      write_now(dir.file("joiner-place"), place(2, 3, port, 2001));
      return;
    }
    if (who == 2) wait_for(dir.file("joiner-place"));
    std::ifstream in(who == 2 ? dir.file("joiner-place") : "/dev/null");
    const std::string joined((std::istreambuf_iterator<char>(in)), {});
    ProcessGroup group = start_worker(dir, who, who == 2 ? joined : place(who, 2, port, 2000));
    auto model = models::create_model(kSpec, 11 + who);  // the joiner's weights are its own
    const TrainResult r =
        Trainer(group, model, synthetic(96, 1), synthetic(40, 2), regroup_options()).fit();
    require(r.regroups == (who == 2 ? 0 : 1), "regroups: " + std::to_string(r.regroups));
    require(r.state_from_rank == 0, "state from rank " + std::to_string(r.state_from_rank));
    require(group.env.world_size == 3, "the world grew to 3");
    require_same_model_everywhere(*group.comm, *model);
    require(r.epochs.back().evaluated && r.epochs.back().eval.accuracy() > 0.6,
            "accuracy after training is too low");
  });
  EXPECT_TRUE(testing::all_ranks_succeeded(outcomes));
}

TEST(Regroup, AVanishedPeerWakesTheSurvivorFromGlooAndEachSampleIsTrainedOnce) {
  // Rank 1 is frozen mid-run (SIGSTOP: its connections stay open, as a pod cut off the network),
  // so rank 0 blocks inside gloo. The notice "regroup:" must wake it at once (its wait would
  // otherwise last the 60 s op timeout). Rank 0 goes on alone from the last step it applied:
  // the epoch's remaining positions, so 24 - k steps in all when the regroup came after step k.
  // Rank 1 then wakes up (SIGCONT) as a stale worker of the old world: it reaches nothing of
  // the new one (a store round and connections of its own) and fails on its own, at once on a
  // closed connection or at its op timeout.
  testing::TempDir dir;
  testing::TestStoreServer server;
  const int port = server.port();
  auto outcomes = testing::run_ranks(3, kRegroupDeadline, [&](int who) {
    if (who == 2) {
      const pid_t pid = signal_rank_one_mid_run(dir, SIGSTOP);
      std::this_thread::sleep_for(300ms);  // rank 0 is blocked in its next collective
      const auto notice_at = std::chrono::steady_clock::now();
      agent_regroups(dir, {0}, "regroup: node 1 was lost", {place(0, 1, port, 3001)});
      require(std::chrono::steady_clock::now() - notice_at < 10s, "rank 0 answered late");
      kill(pid, SIGCONT);
      return;
    }
    // (The stale rank 1 fails at its op timeout at worst: a send of the old world may wait for
    // a receive that never comes.)
    ProcessGroup group = start_worker(dir, who, place(who, 2, port, 3000), /*timeout_sec=*/15);
    auto model = models::create_model(kSpec, 11);
    const TrainResult r =
        Trainer(group, model, synthetic(96, 1), synthetic(40, 2), regroup_options()).fit();
    require(r.regroups == 1 && group.env.world_size == 1, "rank 0 regrouped alone");
    require(r.regrouped_at.size() == 1 && r.global_step == 24 - r.regrouped_at[0],
            fmt::format("ended at step {}; each sample once after a regroup at step {}",
                        r.global_step, r.regrouped_at.empty() ? -1 : r.regrouped_at[0]));
  });
  ASSERT_EQ(outcomes.size(), 3u);
  EXPECT_EQ(outcomes[0].exit_code, 0) << testing::describe(outcomes[0]);
  EXPECT_EQ(outcomes[2].exit_code, 0) << testing::describe(outcomes[2]);
  // The stale rank: its old world's collective failed, and no notice came for it.
  EXPECT_EQ(outcomes[1].exit_code, 1) << testing::describe(outcomes[1]);
}

TEST(Regroup, AKilledPeersClosedConnectionsMakeTheSurvivorWaitForTheNoticeNotFail) {
  // Rank 1 is SIGKILLed: its connections close, and rank 0's collective fails at once, before
  // any agent knows (ddprun declares the node lost at its heartbeat limit). Rank 0 waits for the
  // notice (DDP_REGROUP_WAIT_SEC) instead of failing, and regroups when it comes, 2 s later.
  testing::TempDir dir;
  testing::TestStoreServer server;
  const int port = server.port();
  auto outcomes = testing::run_ranks(3, kRegroupDeadline, [&](int who) {
    if (who == 2) {
      signal_rank_one_mid_run(dir, SIGKILL);
      std::this_thread::sleep_for(2s);  // the heartbeat limit, shortened
      agent_regroups(dir, {0}, "regroup: node 1 was lost", {place(0, 1, port, 4001)});
      return;
    }
    ProcessGroup group = start_worker(dir, who, place(who, 2, port, 4000));
    setenv("DDP_REGROUP_WAIT_SEC", "20", 1);  // over set_worker_env's 0: this test waits
    auto model = models::create_model(kSpec, 11);
    const TrainResult r =
        Trainer(group, model, synthetic(96, 1), synthetic(40, 2), regroup_options()).fit();
    require(r.regroups == 1 && group.env.world_size == 1, "rank 0 regrouped alone");
    require(r.regrouped_at.size() == 1 && r.global_step == 24 - r.regrouped_at[0],
            fmt::format("ended at step {}", r.global_step));
  });
  EXPECT_TRUE(testing::only_victim_was_killed(outcomes, 1));
}

}  // namespace
}  // namespace ddp::train
