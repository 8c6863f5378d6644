#include "ddp/train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <thread>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/nn/functional/loss.h>
#include <torch/optim/optimizer.h>

#include "comm/abort_notice.h"
#include "ddp/comm/communicator.h"
#include "ddp/distributed.h"
#include "ddp/error.h"
#include "ddp/live_metrics.h"
#include "ddp/log.h"
#include "ddp/models/classifier.h"
#include "ddp/settings.h"
#include "ddp/train/checkpoint.h"
#include "ddp/train/metrics_log.h"
#include "ddp/train/resource_usage.h"
#include "ddp/train/stop_signal.h"
#include "train/autocast_scope.h"
#include "train/bf16_support.h"
#include "train/step_trace.h"
#include "train/straggler.h"

namespace ddp::train {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

std::string format_duration(double seconds) {
  const auto s = static_cast<long long>(std::max(0.0, seconds));
  char text[32];
  if (s >= 3600) {
    std::snprintf(text, sizeof text, "%lldh%02lldm", s / 3600, (s / 60) % 60);
  } else {
    std::snprintf(text, sizeof text, "%lldm%02llds", s / 60, s % 60);
  }
  return text;
}

// Every rank's CPU generator state, as uint8 [world, bytes] (collective).
at::Tensor gather_rng_states(Communicator& comm) {
  auto gen = at::detail::getDefaultCPUGenerator();
  at::Tensor state;
  {
    std::lock_guard<std::mutex> lock(gen.mutex());
    state = gen.get_state();
  }
  const int64_t bytes = state.numel();
  const int64_t words = (bytes + 7) / 8;
  at::Tensor padded = at::zeros({words * 8}, at::kByte);
  padded.narrow(0, 0, bytes).copy_(state);
  at::Tensor all = at::empty({comm.size() * words}, at::kLong);
  comm.allgather(padded.view(at::kLong), all);
  return all.view(at::kByte).view({comm.size(), words * 8}).narrow(1, 0, bytes).contiguous();
}

void set_rng_state(const at::Tensor& state) {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

void seed_rng(uint64_t seed) {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_current_seed(seed);
}

// The root's string on every rank (collective).
std::string broadcast_string(Communicator& comm, const std::string& text, int root = 0) {
  std::vector<int64_t> length{static_cast<int64_t>(text.size())};
  comm.broadcast(length, root);
  std::vector<int64_t> words((length[0] + 7) / 8, 0);
  if (comm.rank() == root) std::memcpy(words.data(), text.data(), text.size());
  comm.broadcast(words, root);
  return std::string(reinterpret_cast<const char*>(words.data()), length[0]);
}

// True if any rank passes true (collective).
bool any_rank(Communicator& comm, bool value) {
  std::vector<int64_t> flag{value ? 1 : 0};
  comm.allreduce(flag, ReduceOp::kMax);
  return flag[0] != 0;
}

// The timeline of --trace-steps, into trace_dir, else DDP_TRACE_DIR, else the current directory.
detail::StepTrace make_step_trace(const TrainerOptions& options, const Communicator& comm) {
  if (options.trace_steps.empty()) return detail::StepTrace(std::nullopt, "", comm.rank(), -1);
  const std::string dir = !options.trace_dir.empty()
                              ? options.trace_dir
                              : settings::text(settings::kTraceDir).value_or(".");
  return detail::StepTrace(detail::parse_step_range(options.trace_steps),
                           dir + "/trace-rank" + std::to_string(comm.rank()) + ".json", comm.rank(),
                           comm.topology().node());
}

// The straggler reports' window and threshold: the options, else the settings, else 100 steps
// and 1.2.
detail::StragglerMonitor make_straggler_monitor(const TrainerOptions& options) {
  const int64_t window =
      options.straggler_window.value_or(settings::integer_or_default(settings::kStragglerWindow));
  const double threshold = options.straggler_threshold.value_or(
      static_cast<double>(settings::integer_or_default(settings::kStragglerPercent)) / 100.0);
  if (window < 0) throw ConfigError("the straggler window must not be negative");
  if (!(threshold > 1)) {
    throw ConfigError(
        "the straggler threshold must be above 1 (a ratio to the median rank's "
        "compute), got " +
        std::to_string(threshold));
  }
  return detail::StragglerMonitor(window, threshold);
}

bool same_architecture(const models::ModelSpec& a, const models::ModelSpec& b) {
  return a.name == b.name && a.in_channels == b.in_channels && a.height == b.height &&
         a.width == b.width && a.num_classes == b.num_classes;
}

}  // namespace

Trainer::Trainer(Communicator& comm, std::shared_ptr<models::Classifier> model,
                 data::ImageDataset train_set, data::ImageDataset test_set, TrainerOptions options)
    : comm_(&comm),
      model_(std::move(model)),
      train_set_(std::move(train_set)),
      test_set_(std::move(test_set)),
      options_(std::move(options)) {
  if (!model_) throw ConfigError("Trainer needs a model");
  if (options_.epochs < 1) throw ConfigError("epochs must be at least 1");
  if (train_set_.size() == 0) throw ConfigError("the training set is empty");
  if (options_.checkpoint_every < 0 || options_.max_steps < 0 || options_.log_every < 0) {
    throw ConfigError("checkpoint interval, step limit and log interval must not be negative");
  }
  (void)make_straggler_monitor(options_);  // checks the straggler options
  if (!options_.trace_steps.empty()) (void)detail::parse_step_range(options_.trace_steps);
  if (options_.hang_warn_sec) {
    if (*options_.hang_warn_sec < 0) throw ConfigError("the hang warning must not be negative");
    comm_->set_hang_warning(std::chrono::seconds(*options_.hang_warn_sec));
  }
  const auto& spec = model_->spec();
  if (spec.in_channels != train_set_.channels() || spec.height != train_set_.height() ||
      spec.width != train_set_.width() || spec.num_classes != train_set_.num_classes()) {
    throw ConfigError(
        "model '" + spec.name + "' was built for " + std::to_string(spec.in_channels) + "x" +
        std::to_string(spec.height) + "x" + std::to_string(spec.width) + " images and " +
        std::to_string(spec.num_classes) + " classes, but the training set has " +
        std::to_string(train_set_.channels()) + "x" + std::to_string(train_set_.height()) + "x" +
        std::to_string(train_set_.width()) + " and " + std::to_string(train_set_.num_classes()));
  }
}

Trainer::Trainer(ProcessGroup& group, std::shared_ptr<models::Classifier> model,
                 data::ImageDataset train_set, data::ImageDataset test_set, TrainerOptions options)
    : Trainer(*group.comm, std::move(model), std::move(train_set), std::move(test_set),
              std::move(options)) {
  group_ = &group;
}

Trainer::~Trainer() = default;

namespace {

// What a rank holds in memory when its world ends for a regroup: the state after its last step
// applied, as a checkpoint's bytes, without generator states (the process keeps its own).
struct CarriedState {
  std::string bytes;
  int64_t step = -1;
  int rank = -1;  // in the world it comes from
  int world = 0;
};

// Thrown at a step boundary once the ranks voted to regroup (a node joins): every rank leaves
// its world after the same step.
struct RegroupVoted {};

// One call of Trainer::fit: the run's state, and its steps in the order they run. Each method
// is one concern: resuming, one step, the progress line, an epoch's end, a checkpoint, the end.
class FitRun {
 public:
  // `carried`: the state this process held when its last world ended (a regroup), or null;
  // `regroups`: every rank of the world may hold one, so the run begins by asking them.
  FitRun(Communicator& comm, std::shared_ptr<models::Classifier> model,
         const data::ImageDataset& train_set, const data::ImageDataset& test_set,
         const TrainerOptions& options, const CarriedState* carried = nullptr,
         bool regroups = false);
  TrainResult run();
  // After the run ended for a regroup: whether it got as far as a state of its own (past the
  // state exchange), that state, and what the run did so far.
  bool holds_state() const { return holds_state_; }
  CarriedState carry();
  const TrainResult& partial() const { return result_; }
  bool writes_checkpoints() const { return writes_checkpoints_; }

 private:
  // The figures of the epoch in progress.
  struct EpochStats {
    Clock::time_point start = Clock::now();
    Clock::time_point window_start = start;
    int64_t window_steps = 0;
    double loss_sum = 0;
    int64_t loss_count = 0;
    double comm_wait = 0;
    double data_wait_before = 0;
  };

  static data::DataLoader make_loader(const data::ImageDataset& train_set,
                                      const TrainerOptions& options, int world, int rank);
  // The newest valid checkpoint of any rank's directory, loaded on every rank: from its own
  // file where every rank has it (a shared volume), else sent by the rank that holds it
  // (state_from_peer). Every rank loads it or every rank fails. nullopt: none anywhere.
  std::optional<Checkpoint> load_newest(std::string& chosen);
  // The newest state a rank of this world holds in memory (from an earlier world: a regroup),
  // sent by the rank that holds it to every other; nullopt when none holds one.
  std::optional<Checkpoint> load_held(std::string& chosen);
  // Every rank's `mine` (a step, -1 for none) into `steps`; the newest and the first rank with it.
  std::pair<int64_t, int> newest_step(int64_t mine, std::vector<int64_t>& steps);
  // The state in `bytes` loaded on every rank, or every rank fails (`failure`: this rank's
  // already, say it could not read its file).
  Checkpoint load_on_every_rank(const std::string& bytes, std::exception_ptr failure,
                                const std::string& chosen);
  std::string state_from_peer(const std::string& bytes, std::exception_ptr& failure,
                              const std::string& chosen, int holder, int64_t newest,
                              const std::vector<int64_t>& steps);
  // From the newest valid checkpoint, which every rank agrees on; every rank loads it or the
  // run fails on all of them.
  void resume();
  // DDP over the model, channels-last weights where asked for, the metrics' start record.
  void prepare();
  // Trains the started epoch until it ends, the step limit, or a stop everyone voted for.
  // Returns whether the epoch ran to its end (and the run goes on to evaluate it).
  bool train_epoch(EpochStats& stats);
  // One step, with the stop vote in flight beside it; returns the loss.
  double step(const data::Batch& batch);
  void log_progress(EpochStats& stats, double loss);
  // The epoch's summary, its checkpoint, evaluation and metrics record.
  void end_epoch(const EpochStats& stats);
  // The steps of this world size that the training's progress amounts to: global_step_ in a run
  // whose world size never changed; after a change, what this world would have taken to get
  // here. The schedule, --max-steps and the ETA run on it, so they end with the last epoch.
  int64_t progress_step() const {
    return epoch_ * steps_per_epoch_ + epoch_offset_ / batch_images_ + batch_in_epoch_;
  }
  double learning_rate(int64_t progress) const { return schedule_.at(progress) * lr_scale_; }
  // A checkpoint of the current step (once per step), written by rank 0 and by the lowest rank
  // of each other volume (find_volumes).
  void save_checkpoint(int64_t at_epoch, int64_t at_batch);
  // Whether this rank writes checkpoints: rank 0, and the lowest rank that sees its checkpoint
  // directory as no lower rank does (a volume per pod, emptyDir), so that the state outlives
  // the loss of any pod. Each rank leaves a marker in its directory, and looks for those of the
  // lower ranks: rank 0's first, then the nearest (a pod's ranks are usually contiguous).
  void find_volumes();
  // The writers' last words when ddprun aborts the collectives (a node was lost: AbortNotice): a
  // checkpoint of the last step applied, written without a collective (no generator states),
  // so that the next world redoes only the step in flight. From any thread.
  void save_last_step();
  // The training itself, within run()'s last words.
  void train();
  // Marks the current counters as a step applied (under position_mu_).
  void note_applied();
  // A checkpoint's meta for the training at `at`, in this world.
  struct Position;
  CheckpointMeta meta_at(const Position& at) const;
  // The window's compute and wait times of every rank (collective); rank 0 names stragglers.
  void report_stragglers();
  // Preemption or the final checkpoint, and the end record.
  TrainResult finish();

  Communicator& comm_;
  std::shared_ptr<models::Classifier> model_;
  const data::ImageDataset& train_set_;
  const data::ImageDataset& test_set_;
  const TrainerOptions& options_;
  const Clock::time_point fit_start_ = Clock::now();
  const int rank_;
  const int world_;
  const int64_t batch_images_;
  MetricsLog metrics_;
  // The agent's Prometheus endpoint reads these (ddprun --metrics-port); else they record nothing.
  live::Writer live_;
  double allreduce_bytes_per_step_ = 0;
  data::DataLoader loader_;
  const int64_t steps_per_epoch_;
  const int64_t planned_steps_;
  const int64_t last_step_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  const LrSchedule schedule_;
  CheckpointDirectory checkpoints_;
  std::unique_ptr<DistributedDataParallel> ddp_;
  bool has_buffers_ = false;
  bool bf16_ = false;
  EvalOptions eval_options_;

  TrainResult result_;
  int64_t epoch_ = 0;
  int64_t batch_in_epoch_ = 0;
  // Sample positions of the epoch trained before this world size began it (elastic jobs:
  // CheckpointMeta::epoch_offset); batch_in_epoch_ counts from there.
  int64_t epoch_offset_ = 0;
  // The world size the training began with, and the learning rate's factor for this one: the
  // per-rank batch is kept, so the global batch follows the world size and so does the rate.
  int reference_world_ = world_;
  double lr_scale_ = 1.0;
  // Gradient accumulation (TrainerOptions::keep_global_batch): micro-batches per optimizer
  // step, this one's index in the group, and the group's size (shorter at an epoch's end).
  int64_t accumulate_ = 1;
  int64_t micro_ = 0;
  int64_t group_ = 1;
  bool stop_voted_ = false;  // a stop voted for during the group, taken at its end
  int64_t global_step_ = 0;
  int64_t last_checkpoint_step_ = -1;  // the step of the last checkpoint; -1: none yet
  bool writes_checkpoints_ = false;    // find_volumes
  // The position after the last optimizer step applied, and the lock that keeps the model and
  // the optimizer at it while save_last_step reads them from another thread (last words).
  struct Position {
    int64_t epoch = 0, batch_in_epoch = 0, epoch_offset = 0, global_step = 0;
  };
  std::mutex position_mu_;
  Position applied_;
  std::vector<int64_t> stop_flag_{0};
  bool first_step_done_ = false;
  bool stopping_ = false;
  detail::StragglerMonitor stragglers_;
  detail::StepTrace trace_;
  // DDP_TEST_STEP_DELAY_MS: this rank computes each step this much longer (tests only).
  const std::chrono::milliseconds test_step_delay_;
  const CarriedState* carried_;
  const bool regroups_;
  bool from_memory_ = false;    // the state came from a rank's memory (load_held)
  bool holds_state_ = false;    // past resume() and prepare()
  bool regroup_voted_ = false;  // the ranks voted to regroup (stop flag 2), taken at the boundary
};

FitRun::FitRun(Communicator& comm, std::shared_ptr<models::Classifier> model,
               const data::ImageDataset& train_set, const data::ImageDataset& test_set,
               const TrainerOptions& options, const CarriedState* carried, bool regroups)
    : comm_(comm),
      model_(std::move(model)),
      train_set_(train_set),
      test_set_(test_set),
      options_(options),
      rank_(comm.rank()),
      world_(comm.size()),
      batch_images_(options.data.batch_size * comm.size()),
      loader_(make_loader(train_set, options, comm.size(), comm.rank())),
      steps_per_epoch_(loader_.batches_per_epoch()),
      planned_steps_(options.epochs * steps_per_epoch_),
      last_step_(options.max_steps > 0 ? std::min(options.max_steps, planned_steps_)
                                       : planned_steps_),
      optimizer_(make_optimizer(model_->parameters(), options.optimizer)),
      schedule_(options.optimizer.lr, planned_steps_, steps_per_epoch_, options.schedule),
      checkpoints_(options.checkpoint_dir, options.keep_checkpoints),
      stragglers_(make_straggler_monitor(options)),
      trace_(make_step_trace(options, comm)),
      test_step_delay_(settings::integer_or_default(settings::kTestStepDelayMs)),
      carried_(carried),
      regroups_(regroups) {
  if (rank_ == 0 && !options_.metrics_path.empty()) metrics_ = MetricsLog(options_.metrics_path);
  live_ = live::Writer::from_environment(rank_, world_);
  // A regrouped process keeps its generator (resume() reseeds it where the world changed).
  if (carried_ == nullptr) {
    seed_rng(data::mix_seed(options_.seed, 0x5eed, static_cast<uint64_t>(rank_)));
  }
}

data::DataLoader FitRun::make_loader(const data::ImageDataset& train_set,
                                     const TrainerOptions& options, int world, int rank) {
  data::SamplerOptions sampling;
  sampling.seed = options.seed;
  data::LoaderOptions loading = options.data;
  loading.seed = options.seed;
  return data::DataLoader(
      train_set, data::DistributedSampler(train_set.size(), world, rank, sampling), loading);
}

TrainResult FitRun::run() {
  if (!options_.checkpoint_dir.empty()) find_volumes();
  if (regroups_ || (!options_.checkpoint_dir.empty() && options_.resume)) resume();
  prepare();
  note_applied();
  holds_state_ = true;
  const bool last_words = writes_checkpoints_;
  if (last_words) ddp::detail::AbortNotice::set_last_words([this] { save_last_step(); });
  struct Clear {
    bool on;
    ~Clear() {
      if (on) ddp::detail::AbortNotice::set_last_words(nullptr);
    }
  } clear{last_words};
  try {
    train();
  } catch (const CommError&) {
    // (A regroup keeps the state in memory: no last words.)
    if (ddp::detail::AbortNotice::raised() &&
        ddp::detail::AbortNotice::regroup() == ddp::detail::AbortNotice::Regroup::kNone) {
      ddp::detail::AbortNotice::say_last_words();
    }
    throw;
  }
  return finish();
}

void FitRun::train() {
  while (epoch_ < options_.epochs && !stopping_ && progress_step() < last_step_) {
    loader_.start_epoch(epoch_, batch_in_epoch_, epoch_offset_);
    EpochStats stats;
    stats.data_wait_before = loader_.stats().wait_seconds;
    if (!train_epoch(stats)) {
      save_checkpoint(epoch_, batch_in_epoch_);
      break;
    }
    end_epoch(stats);
  }
}

void FitRun::find_volumes() {
  namespace fs = std::filesystem;
  const fs::path dir = options_.checkpoint_dir;
  std::string nonce;
  if (rank_ == 0) {
    std::random_device random;
    nonce = fmt::format("{:08x}{:08x}", random(), random());
  }
  nonce = broadcast_string(comm_, nonce, 0);
  const auto marker = [&](int r) { return dir / fmt::format(".volume-{}-{}", nonce, r); };
  std::error_code ec;
  fs::create_directories(dir, ec);
  // Every rank learns whether all could write: none waits in a barrier for one that threw.
  const bool written = static_cast<bool>(std::ofstream(marker(rank_)));
  if (any_rank(comm_, !written)) {
    if (!written) {
      throw DataError(marker(rank_).string(),
                      "cannot write in the checkpoint directory; check --checkpoint-dir and its "
                      "volume's permissions");
    }
    throw DataError(dir.string(),
                    "another rank cannot write in its checkpoint directory (see "
                    "its error)");
  }
  writes_checkpoints_ = rank_ == 0 || !fs::exists(marker(0), ec);
  for (int r = rank_ - 1; r > 0 && writes_checkpoints_; --r) {
    writes_checkpoints_ = !fs::exists(marker(r), ec);
  }
  comm_.barrier();
  fs::remove(marker(rank_), ec);
  if (rank_ != 0 && writes_checkpoints_) {
    log::info("{} is a volume of its own (rank 0 does not see it): this rank checkpoints there too",
              dir.string());
  }
}

std::optional<Checkpoint> FitRun::load_newest(std::string& chosen) {
  if (regroups_) {
    if (auto held = load_held(chosen)) return held;
  }
  if (options_.checkpoint_dir.empty() || !options_.resume) return std::nullopt;
  // Each rank's newest valid checkpoint in its own directory: a shared volume shows every rank
  // the same one; a volume per pod (emptyDir) shows each pod its own, or none (a new pod).
  const std::optional<std::string> mine = checkpoints_.latest_valid();
  int64_t step = -1;
  if (mine) {
    const auto named = CheckpointDirectory::step_of(*mine);
    step = named ? *named : read_checkpoint_meta(*mine).global_step;
  }
  std::vector<int64_t> steps;
  const std::pair<int64_t, int> found = newest_step(step, steps);
  const int64_t newest = found.first;
  const int holder = found.second;
  if (newest < 0) return std::nullopt;
  const bool everyone_has =
      std::all_of(steps.begin(), steps.end(), [newest](int64_t s) { return s == newest; });
  chosen = broadcast_string(comm_, rank_ == holder ? *mine : "", holder);
  std::exception_ptr failure;
  std::string bytes;
  try {
    if (everyone_has || rank_ == holder) bytes = read_checkpoint_bytes(*mine);
  } catch (...) {
    failure = std::current_exception();
  }
  if (!everyone_has) bytes = state_from_peer(bytes, failure, chosen, holder, newest, steps);
  return load_on_every_rank(bytes, failure, chosen);
}

std::pair<int64_t, int> FitRun::newest_step(int64_t mine, std::vector<int64_t>& steps) {
  std::vector<int64_t> step{mine};  // (a Buffer views mutable memory)
  steps.assign(static_cast<std::size_t>(world_), -1);
  comm_.allgather(step, steps);
  const auto newest = std::max_element(steps.begin(), steps.end());
  return {*newest, static_cast<int>(newest - steps.begin())};
}

Checkpoint FitRun::load_on_every_rank(const std::string& bytes, std::exception_ptr failure,
                                      const std::string& chosen) {
  Checkpoint loaded;
  try {
    if (!failure) loaded = load_checkpoint_bytes(bytes, chosen, model_.get(), optimizer_.get());
    if (!failure && !same_architecture(loaded.meta.model, model_->spec())) {
      throw ConfigError(chosen + " holds a '" + loaded.meta.model.name +
                        "' model, but this run trains '" + model_->spec().name +
                        "'; use another checkpoint directory");
    }
  } catch (...) {
    failure = std::current_exception();
  }
  if (any_rank(comm_, failure != nullptr)) {
    if (failure) std::rethrow_exception(failure);
    throw DataError(chosen, "another rank could not load this state (see its error)");
  }
  return loaded;
}

std::optional<Checkpoint> FitRun::load_held(std::string& chosen) {
  std::vector<int64_t> steps;
  const std::pair<int64_t, int> found =
      newest_step(carried_ != nullptr ? carried_->step : -1, steps);
  const int64_t newest = found.first;
  const int holder = found.second;
  if (newest < 0) return std::nullopt;
  const auto start = Clock::now();
  const std::string bytes = broadcast_string(comm_, rank_ == holder ? carried_->bytes : "", holder);
  chosen = fmt::format("the state rank {} held in memory (step {})", holder, newest);
  const Checkpoint loaded = load_on_every_rank(bytes, nullptr, chosen);
  from_memory_ = true;
  result_.state_from_rank = holder;
  if (rank_ == 0) {
    log::info(
        "regrouped in-process into {} ranks: the state of step {} came from rank {}'s memory "
        "({:.1f} MB in {:.2f} s); nothing was read from a checkpoint",
        world_, newest, holder, static_cast<double>(bytes.size()) / 1e6,
        seconds_between(start, Clock::now()));
  }
  return loaded;
}

std::string FitRun::state_from_peer(const std::string& bytes, std::exception_ptr& failure,
                                    const std::string& chosen, int holder, int64_t newest,
                                    const std::vector<int64_t>& steps) {
  // The holder could not read its own file: every rank fails with its reason, none waits.
  if (any_rank(comm_, failure != nullptr)) {
    if (failure) std::rethrow_exception(failure);
    throw DataError(chosen, "rank " + std::to_string(holder) +
                                " could not read this checkpoint to send it (see its error)");
  }
  const auto start = Clock::now();
  std::string received = broadcast_string(comm_, bytes, holder);
  result_.state_from_rank = holder;
  const auto lacking =
      std::count_if(steps.begin(), steps.end(), [newest](int64_t s) { return s != newest; });
  if (rank_ == 0) {
    log::info(
        "the newest checkpoint (step {}) is on rank {}'s volume only: its state went to the {} "
        "ranks without it from that rank ({:.1f} MB in {:.2f} s), not from a shared volume",
        newest, holder, lacking, static_cast<double>(received.size()) / 1e6,
        seconds_between(start, Clock::now()));
  }
  return received;
}

void FitRun::resume() {
  std::string chosen;
  const std::optional<Checkpoint> newest = load_newest(chosen);
  if (!newest) return;
  const Checkpoint& loaded = *newest;
  const CheckpointMeta& meta = loaded.meta;
  epoch_ = meta.epoch;
  global_step_ = meta.global_step;
  reference_world_ = meta.reference_world_size;
  if (meta.world_size == world_) {
    epoch_offset_ = meta.epoch_offset;
    batch_in_epoch_ = meta.batch_in_epoch;
  } else {
    // The old world consumed positions [0, offset + batches x batch x its size) of the epoch's
    // order: this one deals out the rest, so that each sample of the epoch is trained once.
    epoch_offset_ = std::min<int64_t>(
        meta.epoch_offset + meta.batch_in_epoch * options_.data.batch_size * meta.world_size,
        train_set_.size());
    batch_in_epoch_ = 0;
  }
  if (epoch_offset_ >= train_set_.size() ||
      batch_in_epoch_ >= loader_.batches_from(epoch_offset_)) {
    ++epoch_;
    batch_in_epoch_ = 0;
    epoch_offset_ = 0;
  }
  lr_scale_ = static_cast<double>(world_) / static_cast<double>(reference_world_);
  if (options_.keep_global_batch && world_ < reference_world_) {
    accumulate_ = std::max<int64_t>(
        1, std::llround(static_cast<double>(reference_world_) / static_cast<double>(world_)));
    lr_scale_ = static_cast<double>(world_ * accumulate_) / static_cast<double>(reference_world_);
    if (rank_ == 0) {
      log::info(
          "keeping the global batch: {} ranks accumulate {} micro-batches per optimizer step "
          "({} images, the {} ranks' {}), learning rate x {}",
          world_, accumulate_, world_ * accumulate_ * options_.data.batch_size, reference_world_,
          int64_t{reference_world_} * options_.data.batch_size, lr_scale_);
    }
  }
  if (from_memory_ && meta.world_size == world_ && carried_ != nullptr && carried_->rank == rank_ &&
      carried_->world == world_) {
    // The same place in a world of the same size: this process's generator goes on as it was.
  } else if (meta.world_size == world_ && loaded.rng_states.defined() &&
             loaded.rng_states.size(0) == world_) {
    set_rng_state(loaded.rng_states[rank_].contiguous());
  } else if (meta.world_size == world_) {
    // A checkpoint written as last words (save_last_step) holds no generator states.
    log::warn(
        "{} holds no random generator states (written when the collectives were aborted): "
        "augmentation and dropout go on from a fresh random stream",
        chosen);
    seed_rng(data::mix_seed(options_.seed, 0x5eed, static_cast<uint64_t>(rank_),
                            static_cast<uint64_t>(global_step_)));
  } else {
    log::warn(
        "the state is of a world of {} ranks, this one has {}: the epoch goes on from sample "
        "position {} of {} (each remaining sample once), augmentation and dropout from a fresh "
        "random stream, at a learning rate scaled by {:.4g} (world {} of the starting {}{})",
        meta.world_size, world_, epoch_offset_, train_set_.size(), lr_scale_, world_,
        reference_world_,
        accumulate_ > 1 ? fmt::format(", {} micro-batches per step", accumulate_) : "");
    seed_rng(data::mix_seed(options_.seed, 0x5eed, static_cast<uint64_t>(rank_),
                            static_cast<uint64_t>(global_step_)));
  }
  result_.resumed_from_step = global_step_;
  last_checkpoint_step_ = global_step_;
  if (rank_ == 0) {
    log::info("resumed from {} (epoch {}, batch {}, step {})", chosen, epoch_ + 1, batch_in_epoch_,
              global_step_);
  }
}

void FitRun::prepare() {
  if (options_.data.transform.channels_last) {
    c10::AutoGradMode no_grad(false);
    for (auto& p : model_->parameters()) {
      if (p.dim() == 4) p.set_data(p.contiguous(at::MemoryFormat::ChannelsLast));
    }
  }
  ddp_ = std::make_unique<DistributedDataParallel>(model_, comm_, options_.ddp);
  for (const BucketInfo& bucket : ddp_->buckets()) {
    allreduce_bytes_per_step_ += static_cast<double>(bucket.bytes);
  }
  if (options_.ddp.compression == GradientCompression::kBFloat16) allreduce_bytes_per_step_ /= 2;
  has_buffers_ = !model_->buffers().empty();
  model_->train();

  // Falls back to float32, with a warning, on a CPU without native bfloat16.
  bf16_ = detail::bf16_autocast_enabled(options_.bf16);
  eval_options_.batch_size = options_.eval_batch_size;
  eval_options_.transform = options_.data.transform;
  eval_options_.bf16 = bf16_;

  metrics_.write("start", {{"world_size", int64_t{world_}},
                           {"model", model_->spec().name},
                           {"batch_size_per_rank", options_.data.batch_size},
                           {"steps_per_epoch", steps_per_epoch_},
                           {"epochs", options_.epochs},
                           {"start_step", global_step_},
                           {"epoch_offset", epoch_offset_},
                           {"reference_world_size", int64_t{reference_world_}},
                           {"lr_scale", lr_scale_},
                           {"accumulation_steps", accumulate_},
                           {"bf16", bf16_},
                           {"bf16_requested", options_.bf16},
                           {"seconds_since_process_start", seconds_since_process_start()}});
}

bool FitRun::train_epoch(EpochStats& stats) {
  while (progress_step() < last_step_) {
    const auto data_start = Clock::now();
    std::optional<data::Batch> batch = loader_.next();
    if (!batch) break;
    trace_.span("data wait", data_start, Clock::now(), global_step_ + 1);
    const double loss = step(*batch);
    stats.loss_sum += loss;
    ++stats.loss_count;
    ++stats.window_steps;       // batches, which are micro-batches when accumulating
    if (micro_ != 0) continue;  // in the middle of an accumulation group
    stats.comm_wait += ddp_->last_backward().wait_seconds;

    if (!first_step_done_) {
      first_step_done_ = true;
      const double since_start = seconds_since_process_start();
      if (rank_ == 0) log::info("first step done {:.3f} s after process start", since_start);
      metrics_.write("first_step", {{"seconds_since_process_start", since_start},
                                    {"seconds_in_fit", seconds_between(fit_start_, Clock::now())}});
    }
    if (options_.log_every > 0 && global_step_ % options_.log_every == 0) {
      log_progress(stats, loss);
    }
    if (regroup_voted_) throw RegroupVoted{};  // the step is applied and logged
    if (stragglers_.due()) report_stragglers();
    if (stopping_) break;
    if (options_.checkpoint_every > 0 && global_step_ % options_.checkpoint_every == 0) {
      save_checkpoint(epoch_, batch_in_epoch_);
    }
    trace_.write_after(global_step_);
  }
  return !stopping_ && batch_in_epoch_ >= loader_.batches_per_epoch();
}

double FitRun::step(const data::Batch& batch) {
  if (micro_ == 0) {
    // The group's micro-batches: accumulate_, fewer where the epoch or the training ends first.
    group_ = std::min(
        {accumulate_, loader_.batches_per_epoch() - batch_in_epoch_, last_step_ - progress_step()});
    group_ = std::max<int64_t>(group_, 1);
  }
  const bool last_micro = micro_ + 1 >= group_;
  const int64_t step_number = global_step_ + 1;
  trace_.begin_step(comm_, step_number);
  // Agree on stopping while this step computes: every rank leaves after the same step. 2: a
  // regroup notice (a node joins, or was lost): every rank leaves its world after the same step.
  // (A node that leaves stops every rank by its own vote.)
  using Regroup = ddp::detail::AbortNotice::Regroup;
  const Regroup notice = ddp::detail::AbortNotice::regroup();
  const bool regroup = regroups_ && (notice == Regroup::kAfterStep || notice == Regroup::kNow);
  stop_flag_[0] = regroup ? 2 : stop_requested() ? 1 : 0;
  Work stop_vote = [&] {
    const flight::OpLabel label("stopvote", -1);
    return comm_.allreduce_async(stop_flag_, ReduceOp::kMax);
  }();
  // The vote writes into stop_flag_: never leave this scope (even by an exception) before it
  // completes.
  struct WaitForVote {
    Work& work;
    ~WaitForVote() {
      try {
        work.wait();
      } catch (...) {
      }
    }
  } wait_for_vote{stop_vote};

  // Compute time: the step's, less its waits for other ranks (rank 0's buffers, the gradients'
  // allreduces at the end of backward).
  const auto start = Clock::now();
  // A group's rate is the one at its first micro-batch, where an unaccumulated step would be.
  if (micro_ == 0) set_learning_rate(*optimizer_, learning_rate(progress_step()));
  double waits = 0;
  if (has_buffers_ && micro_ == 0) {
    ddp_->sync_buffers();
    waits += seconds_between(start, Clock::now());
    trace_.span("sync buffers", start, Clock::now(), step_number);
  }
  if (micro_ == 0) optimizer_->zero_grad();
  const auto forward_start = Clock::now();
  at::Tensor logits;
  {
    detail::AutocastScope autocast(bf16_);
    logits = model_->forward(batch.images);
  }
  if (test_step_delay_.count() > 0) std::this_thread::sleep_for(test_step_delay_);
  at::Tensor loss = torch::nn::functional::cross_entropy(logits.to(at::kFloat), batch.labels);
  const auto backward_start = Clock::now();
  trace_.span("forward", forward_start, backward_start, step_number);
  {
    // All but a group's last micro-batch accumulate locally; the last one's backward averages
    // the sum across ranks. Each contributes 1/group of the mean.
    std::optional<DistributedDataParallel::NoSync> local;
    if (!last_micro) local.emplace(ddp_->no_sync());
    (group_ > 1 ? loss / static_cast<double>(group_) : loss).backward();
  }
  const auto optimizer_start = Clock::now();
  trace_.span("backward", backward_start, optimizer_start, step_number);
  if (last_micro) {
    {
      std::lock_guard<std::mutex> lock(position_mu_);
      optimizer_->step();
      // The position after this step, whose counters move below, after the stop vote.
      applied_ = {epoch_, batch_in_epoch_ + 1, epoch_offset_, global_step_ + 1};
    }
    trace_.span("optimizer step", optimizer_start, Clock::now(), step_number);
    waits += ddp_->last_backward().wait_seconds;
  }
  const double step_seconds = seconds_between(start, Clock::now());
  stragglers_.add_step(step_seconds - waits, waits);
  live_.add_step(step_seconds, static_cast<std::uint64_t>(batch.labels.size(0)),
                 last_micro ? ddp_->last_backward().wait_seconds : 0.0,
                 last_micro ? allreduce_bytes_per_step_ : 0.0);
  ++batch_in_epoch_;
  const double loss_value = loss.item<double>();
  stop_vote.wait();
  stop_voted_ = stop_voted_ || stop_flag_[0] == 1;
  regroup_voted_ = regroup_voted_ || stop_flag_[0] == 2;
  if (last_micro) {
    ++global_step_;
    micro_ = 0;
    // Only between optimizer steps, so that a checkpoint never holds half a group.
    stopping_ = stop_voted_;
    stop_voted_ = false;
  } else {
    ++micro_;
  }
  trace_.end_step(comm_, step_number);
  return loss_value;
}

void FitRun::log_progress(EpochStats& stats, double loss) {
  const auto now = Clock::now();
  const double window = seconds_between(stats.window_start, now);
  const double rate = static_cast<double>(stats.window_steps * batch_images_) / window;
  const double eta = window / static_cast<double>(stats.window_steps) *
                     static_cast<double>(last_step_ - progress_step());
  const double lr = learning_rate(progress_step() - 1);
  if (rank_ == 0) {  // every rank's figures go to the live metrics below
    log::info("epoch {}/{} step {}/{} loss {:.4f} lr {:.4g} {:.0f} img/s ETA {}", epoch_ + 1,
              options_.epochs, epoch_offset_ / batch_images_ + batch_in_epoch_, steps_per_epoch_,
              loss, lr, rate, format_duration(eta));
  }
  metrics_.write("step", {{"step", global_step_},
                          {"epoch", epoch_},
                          {"loss", loss},
                          {"lr", lr},
                          {"images_per_second", rate},
                          {"step_seconds", window / static_cast<double>(stats.window_steps)}});
  live_.set_progress(global_step_, epoch_, loss, lr, rate / static_cast<double>(world_),
                     window / static_cast<double>(stats.window_steps));
  stats.window_start = now;
  stats.window_steps = 0;
}

void FitRun::report_stragglers() {
  const detail::StragglerReport report = stragglers_.share(comm_);
  if (report.median_compute_ms > 0) {
    live_.set_straggler_ratio(report.compute_ms[static_cast<std::size_t>(rank_)] /
                              report.median_compute_ms);
  }
  if (rank_ != 0) return;
  // At most a few lines, however many ranks lag: the slowest first, the rest counted.
  constexpr std::size_t kNamed = 5;
  const Topology& topology = comm_.topology();
  for (std::size_t i = 0; i < std::min(kNamed, report.stragglers.size()); ++i) {
    const detail::Straggler& s = report.stragglers[i];
    // A communicator that knows no topology (one a program implements itself) names no node.
    const int node = topology.size() == world_ ? topology.node_of(s.rank) : -1;
    log::warn("straggler: {}", detail::describe(s, node, report.median_compute_ms, report.steps));
  }
  if (report.stragglers.size() > kNamed) {
    log::warn("straggler: {} more ranks compute over {:.2f}x the median",
              report.stragglers.size() - kNamed, stragglers_.threshold());
  }
  std::vector<double> named;
  for (const auto& s : report.stragglers) named.push_back(static_cast<double>(s.rank));
  // The slowest rank's compute over the median's, whether or not it passed the threshold.
  double slowest_ratio = 0;
  if (report.median_compute_ms > 0) {
    slowest_ratio = *std::max_element(report.compute_ms.begin(), report.compute_ms.end()) /
                    report.median_compute_ms;
  }
  metrics_.write("ranks", {{"step", global_step_},
                           {"window_steps", report.steps},
                           {"compute_ms", report.compute_ms},
                           {"wait_ms", report.wait_ms},
                           {"median_compute_ms", report.median_compute_ms},
                           {"stragglers", named},
                           {"slowest_ratio", slowest_ratio}});
}

void FitRun::end_epoch(const EpochStats& stats) {
  const double train_seconds = seconds_between(stats.start, Clock::now());
  EpochSummary summary;
  summary.epoch = epoch_;
  summary.seconds = train_seconds;
  summary.train_loss =
      stats.loss_count ? stats.loss_sum / static_cast<double>(stats.loss_count) : 0;
  summary.images_per_second = static_cast<double>(stats.loss_count * batch_images_) / train_seconds;
  ++epoch_;
  batch_in_epoch_ = 0;
  epoch_offset_ = 0;
  note_applied();
  save_checkpoint(epoch_, 0);

  double eval_seconds = 0;
  if (options_.evaluate_each_epoch && test_set_.size() > 0) {
    const auto eval_start = Clock::now();
    if (has_buffers_) ddp_->sync_buffers();
    summary.eval = evaluate(*model_, test_set_, eval_options_, &comm_);
    summary.evaluated = true;
    eval_seconds = seconds_between(eval_start, Clock::now());
    if (rank_ == 0) {
      log::info(
          "epoch {}/{}: train loss {:.4f}, {:.0f} img/s; test accuracy {:.2f}% (loss "
          "{:.4f}, {:.1f} s)",
          epoch_, options_.epochs, summary.train_loss, summary.images_per_second,
          100.0 * summary.eval.accuracy(), summary.eval.mean_loss(), eval_seconds);
    }
  }
  metrics_.write("epoch",
                 {{"epoch", epoch_},
                  {"step", global_step_},
                  {"train_loss", summary.train_loss},
                  {"images_per_second", summary.images_per_second},
                  {"train_seconds", train_seconds},
                  {"eval_seconds", eval_seconds},
                  {"test_accuracy", summary.evaluated ? summary.eval.accuracy() : -1.0},
                  {"test_loss", summary.evaluated ? summary.eval.mean_loss() : -1.0},
                  {"data_wait_seconds", loader_.stats().wait_seconds - stats.data_wait_before},
                  {"comm_wait_seconds", stats.comm_wait},
                  {"elapsed_seconds", seconds_between(fit_start_, Clock::now())}});
  result_.epochs.push_back(std::move(summary));
  // A signal during evaluation stops here, after the epoch's checkpoint.
  stopping_ = any_rank(comm_, stop_requested());
}

CarriedState FitRun::carry() {
  std::lock_guard<std::mutex> lock(position_mu_);
  CarriedState carried;
  Checkpoint checkpoint;
  checkpoint.meta = meta_at(applied_);
  carried.bytes = serialize_checkpoint(checkpoint, *model_, optimizer_.get());
  carried.step = applied_.global_step;
  carried.rank = rank_;
  carried.world = world_;
  return carried;
}

void FitRun::note_applied() {
  std::lock_guard<std::mutex> lock(position_mu_);
  applied_ = {epoch_, batch_in_epoch_, epoch_offset_, global_step_};
}

CheckpointMeta FitRun::meta_at(const Position& at) const {
  CheckpointMeta meta;
  meta.model = model_->spec();
  meta.class_names = train_set_.class_names;
  meta.epoch = at.epoch;
  meta.batch_in_epoch = at.batch_in_epoch;
  meta.global_step = at.global_step;
  meta.world_size = world_;
  meta.epoch_offset = at.epoch_offset;
  meta.reference_world_size = reference_world_;
  meta.seed = options_.seed;
  return meta;
}

void FitRun::save_last_step() {
  std::lock_guard<std::mutex> lock(position_mu_);
  if (applied_.global_step == last_checkpoint_step_) {
    log::info("step {}, the last one applied, is checkpointed already: {}", applied_.global_step,
              ddp::detail::AbortNotice::message());
    return;
  }
  const auto start = Clock::now();
  Checkpoint checkpoint;
  checkpoint.meta = meta_at(applied_);
  const std::string path = checkpoints_.save(
      applied_.global_step, serialize_checkpoint(checkpoint, *model_, optimizer_.get()));
  last_checkpoint_step_ = applied_.global_step;
  log::info("checkpoint {} ({:.2f} s) of step {}, the last one applied: {}", path,
            seconds_between(start, Clock::now()), applied_.global_step,
            ddp::detail::AbortNotice::message());
}

void FitRun::save_checkpoint(int64_t at_epoch, int64_t at_batch) {
  if (options_.checkpoint_dir.empty() || last_checkpoint_step_ == global_step_) return;
  const auto start = Clock::now();
  Checkpoint checkpoint;
  checkpoint.meta = meta_at({at_epoch, at_batch, epoch_offset_, global_step_});
  checkpoint.rng_states = gather_rng_states(comm_);
  std::lock_guard<std::mutex> lock(position_mu_);
  last_checkpoint_step_ = global_step_;
  if (!writes_checkpoints_) return;
  const std::string path =
      checkpoints_.save(global_step_, serialize_checkpoint(checkpoint, *model_, optimizer_.get()));
  const double seconds = seconds_between(start, Clock::now());
  trace_.span("checkpoint", start, Clock::now(), global_step_);
  log::info("checkpoint {} ({:.2f} s)", path, seconds);
  metrics_.write("checkpoint", {{"path", path}, {"step", global_step_}, {"seconds", seconds}});
}

TrainResult FitRun::finish() {
  if (stopping_ && progress_step() < last_step_) {
    result_.status = TrainStatus::kPreempted;
    if (rank_ == 0 && stop_signal_number() != 0) {
      log::warn("stopped by signal {} after step {}; the checkpoint resumes it",
                stop_signal_number(), global_step_);
    } else if (rank_ == 0) {
      log::warn("stopped after step {} by another rank's stop signal; the checkpoint resumes it",
                global_step_);
    }
  } else {
    save_checkpoint(epoch_, batch_in_epoch_);
  }
  result_.global_step = global_step_;
  trace_.write_after(trace_.last_step());  // a run that ended inside the range: what it traced

  std::vector<double> mine{peak_rss_mib()};
  std::vector<double> peaks(world_);
  comm_.allgather(mine, peaks);
  metrics_.write(
      "end", {{"status",
               std::string(result_.status == TrainStatus::kCompleted ? "completed" : "preempted")},
              {"step", global_step_},
              {"elapsed_seconds", seconds_between(fit_start_, Clock::now())},
              {"peak_rss_mib_per_rank", peaks}});
  return result_;
}

}  // namespace

TrainResult Trainer::fit() {
  if (options_.tune_malloc) keep_freed_memory_for_reuse();
  if (options_.handle_signals) install_stop_signal_handlers();
  if (group_ != nullptr && group_->can_regroup()) return fit_regrouping();
  FitRun run(*comm_, model_, train_set_, test_set_, options_);
  return run.run();
}

namespace {

// Whether `error` ended the world for a regroup: ddprun's notice came, or comes within
// DDP_REGROUP_WAIT_SEC of a collective failure (a peer killed: its connections closed before
// ddprun declared its node lost). A stop signal ends the wait: the node is being stopped.
// Adds what the run of one world did to `before`, the earlier worlds' result.
void note_world(TrainResult& before, const TrainResult& world) {
  before.epochs.insert(before.epochs.end(), world.epochs.begin(), world.epochs.end());
  if (before.resumed_from_step == -2) {
    before.resumed_from_step = world.resumed_from_step;
  } else if (before.regrouped_at.size() < static_cast<std::size_t>(before.regroups) &&
             world.resumed_from_step >= 0) {
    before.regrouped_at.push_back(world.resumed_from_step);
  }
}

// The last world's result with what the earlier ones did.
TrainResult with_earlier_worlds(TrainResult before, TrainResult last) {
  note_world(before, last);
  last.epochs = std::move(before.epochs);
  last.regroups = before.regroups;
  last.regrouped_at = before.regrouped_at;
  if (before.resumed_from_step != -2) last.resumed_from_step = before.resumed_from_step;
  return last;
}

bool notice_within_wait() {
  const auto deadline =
      Clock::now() + std::chrono::seconds(settings::integer_or_default(settings::kRegroupWaitSec));
  while (Clock::now() < deadline && !stop_requested()) {
    if (regroup_requested(std::chrono::milliseconds(100))) return true;
  }
  return regroup_requested();
}

bool ended_for_regroup(const std::exception& error) {
  if (regroup_requested()) return true;
  if (dynamic_cast<const ConfigError*>(&error) != nullptr ||
      dynamic_cast<const DataError*>(&error) != nullptr) {
    return false;
  }
  return notice_within_wait();
}

// A world that ended because another node's ranks were asked to stop (their node leaves: a
// deleted pod, a spot reclaim): the stop vote ended it for every rank, after a checkpoint. This
// rank, not asked itself, stays for the regroup ddprun then offers.
bool left_by_a_peer(const TrainResult& result) {
  return result.status == TrainStatus::kPreempted && !stop_requested();
}

// While the process waits for its place in the next world, its last words (should ddprun fall
// back to a restart after all) are the state it carries, where it writes checkpoints.
void carry_as_last_words(const CarriedState& carried, const TrainerOptions& options) {
  ddp::detail::AbortNotice::set_last_words([&carried, &options] {
    const std::string path = CheckpointDirectory(options.checkpoint_dir, options.keep_checkpoints)
                                 .save(carried.step, carried.bytes);
    log::info("checkpoint {} of step {}, the state held for the regroup: {}", path, carried.step,
              ddp::detail::AbortNotice::message());
  });
}

}  // namespace

TrainResult Trainer::fit_regrouping() {
  ProcessGroup& group = *group_;
  group.offer_regroup();
  struct Withdraw {
    ProcessGroup& group;
    ~Withdraw() {
      ddp::detail::AbortNotice::set_last_words(nullptr);
      group.withdraw_regroup();
    }
  } withdraw{group};
  std::optional<CarriedState> carried;
  TrainResult before;  // what the earlier worlds did
  before.resumed_from_step = -2;
  for (;;) {
    if (options_.hang_warn_sec) {
      group.comm->set_hang_warning(std::chrono::seconds(*options_.hang_warn_sec));
    }
    auto run = std::make_unique<FitRun>(*group.comm, model_, train_set_, test_set_, options_,
                                        carried ? &*carried : nullptr, /*regroups=*/true);
    try {
      TrainResult result = run->run();
      if (!left_by_a_peer(result)) return with_earlier_worlds(before, result);
      log::info(
          "another node is leaving (its stop signal ended this world after step {}): "
          "this rank stays for ddprun's regroup",
          result.global_step);
      if (!notice_within_wait()) return with_earlier_worlds(before, result);
    } catch (const RegroupVoted&) {
      log::info("leaving this world after the ranks' last step together, to regroup: {}",
                ddp::detail::AbortNotice::reason());
    } catch (const std::exception& e) {
      if (!ended_for_regroup(e)) throw;
      log::warn("giving up the step in flight to regroup ({}): {}",
                ddp::detail::AbortNotice::reason(), e.what());
    }
    if (run->holds_state()) carried = run->carry();
    note_world(before, run->partial());
    const bool last_words = carried && run->writes_checkpoints();
    run.reset();
    if (last_words) carry_as_last_words(*carried, options_);
    try {
      group.regroup();
    } catch (...) {
      ddp::detail::AbortNotice::say_last_words();  // a restart then resumes from this state
      throw;
    }
    ddp::detail::AbortNotice::set_last_words(nullptr);
    ++before.regroups;
  }
}

}  // namespace ddp::train
