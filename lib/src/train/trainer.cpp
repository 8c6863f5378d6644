#include "ddp/train/trainer.h"

#include <chrono>
#include <cmath>
#include <cstdio>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/nn/functional/loss.h>
#include <torch/optim/optimizer.h>

#include "ddp/comm/communicator.h"
#include "ddp/error.h"
#include "ddp/log.h"
#include "ddp/models/classifier.h"
#include "ddp/train/checkpoint.h"
#include "ddp/train/metrics_log.h"
#include "ddp/train/resource_usage.h"
#include "ddp/train/stop_signal.h"
#include "train/autocast_scope.h"
#include "train/bf16_support.h"

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

// Rank 0's string on every rank (collective).
std::string broadcast_string(Communicator& comm, const std::string& text) {
  std::vector<int64_t> length{static_cast<int64_t>(text.size())};
  comm.broadcast(length, 0);
  std::vector<int64_t> words((length[0] + 7) / 8, 0);
  if (comm.rank() == 0) std::memcpy(words.data(), text.data(), text.size());
  comm.broadcast(words, 0);
  return std::string(reinterpret_cast<const char*>(words.data()), length[0]);
}

// True if any rank passes true (collective).
bool any_rank(Communicator& comm, bool value) {
  std::vector<int64_t> flag{value ? 1 : 0};
  comm.allreduce(flag, ReduceOp::kMax);
  return flag[0] != 0;
}

bool same_architecture(const models::ModelSpec& a, const models::ModelSpec& b) {
  return a.name == b.name && a.in_channels == b.in_channels && a.height == b.height &&
         a.width == b.width && a.num_classes == b.num_classes;
}

}  // namespace

Trainer::Trainer(Communicator& comm, std::shared_ptr<models::Classifier> model,
                 data::ImageDataset train_set, data::ImageDataset test_set, TrainerOptions options)
    : comm_(comm),
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

Trainer::~Trainer() = default;

TrainResult Trainer::fit() {
  const auto fit_start = Clock::now();
  const int rank = comm_.rank();
  const int world = comm_.size();
  if (options_.tune_malloc) keep_freed_memory_for_reuse();
  if (options_.handle_signals) install_stop_signal_handlers();
  MetricsLog metrics;
  if (rank == 0 && !options_.metrics_path.empty()) metrics = MetricsLog(options_.metrics_path);

  data::SamplerOptions sampling;
  sampling.seed = options_.seed;
  data::LoaderOptions loading = options_.data;
  loading.seed = options_.seed;
  data::DataLoader loader(
      train_set_, data::DistributedSampler(train_set_.size(), world, rank, sampling), loading);
  const int64_t steps_per_epoch = loader.batches_per_epoch();
  const int64_t planned_steps = options_.epochs * steps_per_epoch;
  const int64_t last_step =
      options_.max_steps > 0 ? std::min(options_.max_steps, planned_steps) : planned_steps;

  auto optimizer = make_optimizer(model_->parameters(), options_.optimizer);
  const LrSchedule schedule(options_.optimizer.lr, planned_steps, steps_per_epoch,
                            options_.schedule);
  seed_rng(data::mix_seed(options_.seed, 0x5eed, static_cast<uint64_t>(rank)));

  TrainResult result;
  int64_t epoch = 0;
  int64_t batch_in_epoch = 0;
  int64_t global_step = 0;
  CheckpointDirectory checkpoints(options_.checkpoint_dir, options_.keep_checkpoints);

  if (!options_.checkpoint_dir.empty() && options_.resume) {
    std::string chosen;
    if (rank == 0) chosen = checkpoints.latest_valid().value_or("");
    chosen = broadcast_string(comm_, chosen);
    if (!chosen.empty()) {
      std::exception_ptr failure;
      Checkpoint loaded;
      try {
        loaded = load_checkpoint(chosen, model_.get(), optimizer.get());
        if (!same_architecture(loaded.meta.model, model_->spec())) {
          throw ConfigError(chosen + " holds a '" + loaded.meta.model.name +
                            "' model, but this run trains '" + model_->spec().name +
                            "'; use another checkpoint directory");
        }
      } catch (...) {
        failure = std::current_exception();
      }
      if (any_rank(comm_, failure != nullptr)) {
        if (failure) std::rethrow_exception(failure);
        throw DataError(chosen, "another rank could not load this checkpoint (see its error)");
      }
      const CheckpointMeta& meta = loaded.meta;
      epoch = meta.epoch;
      batch_in_epoch = meta.batch_in_epoch;
      global_step = meta.global_step;
      if (batch_in_epoch >= steps_per_epoch) {
        ++epoch;
        batch_in_epoch = 0;
      }
      if (meta.world_size == world && loaded.rng_states.defined() &&
          loaded.rng_states.size(0) == world) {
        set_rng_state(loaded.rng_states[rank].contiguous());
      } else {
        log::warn(
            "checkpoint was written by {} ranks, this run has {}: data order and dropout "
            "continue from a fresh stream",
            meta.world_size, world);
        seed_rng(data::mix_seed(options_.seed, 0x5eed, static_cast<uint64_t>(rank),
                                static_cast<uint64_t>(global_step)));
      }
      result.resumed_from_step = global_step;
      if (rank == 0) {
        log::info("resumed from {} (epoch {}, batch {}, step {})", chosen, epoch + 1,
                  batch_in_epoch, global_step);
      }
    }
  }

  if (options_.data.transform.channels_last) {
    c10::AutoGradMode no_grad(false);
    for (auto& p : model_->parameters()) {
      if (p.dim() == 4) p.set_data(p.contiguous(at::MemoryFormat::ChannelsLast));
    }
  }
  DistributedDataParallel ddp(model_, comm_, options_.ddp);
  const bool has_buffers = !model_->buffers().empty();
  model_->train();

  // Falls back to float32, with a warning, on a CPU without native bfloat16.
  const bool bf16 = detail::bf16_autocast_enabled(options_.bf16);
  EvalOptions eval_options;
  eval_options.batch_size = options_.eval_batch_size;
  eval_options.transform = options_.data.transform;
  eval_options.bf16 = bf16;

  metrics.write("start", {{"world_size", int64_t{world}},
                          {"model", model_->spec().name},
                          {"batch_size_per_rank", options_.data.batch_size},
                          {"steps_per_epoch", steps_per_epoch},
                          {"epochs", options_.epochs},
                          {"start_step", global_step},
                          {"bf16", bf16},
                          {"bf16_requested", options_.bf16},
                          {"seconds_since_process_start", seconds_since_process_start()}});

  int64_t last_checkpoint_step = result.resumed_from_step;
  auto save_checkpoint = [&](int64_t at_epoch, int64_t at_batch) {
    if (options_.checkpoint_dir.empty() || last_checkpoint_step == global_step) return;
    const auto start = Clock::now();
    Checkpoint checkpoint;
    checkpoint.meta.model = model_->spec();
    checkpoint.meta.class_names = train_set_.class_names;
    checkpoint.meta.epoch = at_epoch;
    checkpoint.meta.batch_in_epoch = at_batch;
    checkpoint.meta.global_step = global_step;
    checkpoint.meta.world_size = world;
    checkpoint.meta.seed = options_.seed;
    checkpoint.rng_states = gather_rng_states(comm_);
    last_checkpoint_step = global_step;
    if (rank != 0) return;
    const std::string path =
        checkpoints.save(global_step, serialize_checkpoint(checkpoint, *model_, optimizer.get()));
    const double seconds = seconds_between(start, Clock::now());
    log::info("checkpoint {} ({:.2f} s)", path, seconds);
    metrics.write("checkpoint", {{"path", path}, {"step", global_step}, {"seconds", seconds}});
  };

  std::vector<int64_t> stop_flag{0};
  bool first_step_done = false;
  bool stopping = false;
  const int64_t batch_images = options_.data.batch_size * world;

  while (epoch < options_.epochs && !stopping && global_step < last_step) {
    loader.start_epoch(epoch, batch_in_epoch);
    const auto epoch_start = Clock::now();
    auto window_start = epoch_start;
    int64_t window_steps = 0;
    double loss_sum = 0;
    int64_t loss_count = 0;
    double comm_wait = 0;
    const double data_wait_before = loader.stats().wait_seconds;

    while (global_step < last_step) {
      std::optional<data::Batch> batch = loader.next();
      if (!batch) break;
      // Agree on stopping while this step computes: every rank leaves after the same step.
      stop_flag[0] = stop_requested() ? 1 : 0;
      Work stop_vote = comm_.allreduce_async(stop_flag, ReduceOp::kMax);
      // The vote writes into stop_flag: never leave this scope (even by an exception) before
      // it completes.
      struct WaitForVote {
        Work& work;
        ~WaitForVote() {
          try {
            work.wait();
          } catch (...) {
          }
        }
      } wait_for_vote{stop_vote};

      set_learning_rate(*optimizer, schedule.at(global_step));
      if (has_buffers) ddp.sync_buffers();
      optimizer->zero_grad();
      at::Tensor logits;
      {
        detail::AutocastScope autocast(bf16);
        logits = model_->forward(batch->images);
      }
      at::Tensor loss = torch::nn::functional::cross_entropy(logits.to(at::kFloat), batch->labels);
      loss.backward();
      optimizer->step();
      ++global_step;
      ++batch_in_epoch;
      ++window_steps;
      const double loss_value = loss.item<double>();
      loss_sum += loss_value;
      ++loss_count;
      comm_wait += ddp.last_backward().wait_seconds;
      stop_vote.wait();
      stopping = stop_flag[0] != 0;

      if (!first_step_done) {
        first_step_done = true;
        const double since_start = seconds_since_process_start();
        if (rank == 0) log::info("first step done {:.3f} s after process start", since_start);
        metrics.write("first_step", {{"seconds_since_process_start", since_start},
                                     {"seconds_in_fit", seconds_between(fit_start, Clock::now())}});
      }
      if (rank == 0 && options_.log_every > 0 && global_step % options_.log_every == 0) {
        const auto now = Clock::now();
        const double window = seconds_between(window_start, now);
        const double rate = static_cast<double>(window_steps * batch_images) / window;
        const double eta = window / static_cast<double>(window_steps) *
                           static_cast<double>(last_step - global_step);
        log::info("epoch {}/{} step {}/{} loss {:.4f} lr {:.4g} {:.0f} img/s ETA {}", epoch + 1,
                  options_.epochs, batch_in_epoch, steps_per_epoch, loss_value,
                  schedule.at(global_step - 1), rate, format_duration(eta));
        metrics.write("step", {{"step", global_step},
                               {"epoch", epoch},
                               {"loss", loss_value},
                               {"lr", schedule.at(global_step - 1)},
                               {"images_per_second", rate},
                               {"step_seconds", window / static_cast<double>(window_steps)}});
        window_start = now;
        window_steps = 0;
      }
      if (stopping) break;
      if (options_.checkpoint_every > 0 && global_step % options_.checkpoint_every == 0) {
        save_checkpoint(epoch, batch_in_epoch);
      }
    }

    const double train_seconds = seconds_between(epoch_start, Clock::now());
    const bool epoch_done = batch_in_epoch >= steps_per_epoch;
    if (stopping || !epoch_done) {
      save_checkpoint(epoch, batch_in_epoch);
      break;
    }

    EpochSummary summary;
    summary.epoch = epoch;
    summary.seconds = train_seconds;
    summary.train_loss = loss_count ? loss_sum / static_cast<double>(loss_count) : 0;
    summary.images_per_second = static_cast<double>(loss_count * batch_images) / train_seconds;
    ++epoch;
    batch_in_epoch = 0;
    save_checkpoint(epoch, 0);

    double eval_seconds = 0;
    if (options_.evaluate_each_epoch && test_set_.size() > 0) {
      const auto eval_start = Clock::now();
      if (has_buffers) ddp.sync_buffers();
      summary.eval = evaluate(*model_, test_set_, eval_options, &comm_);
      summary.evaluated = true;
      eval_seconds = seconds_between(eval_start, Clock::now());
      if (rank == 0) {
        log::info(
            "epoch {}/{}: train loss {:.4f}, {:.0f} img/s; test accuracy {:.2f}% (loss "
            "{:.4f}, {:.1f} s)",
            epoch, options_.epochs, summary.train_loss, summary.images_per_second,
            100.0 * summary.eval.accuracy(), summary.eval.mean_loss(), eval_seconds);
      }
    }
    metrics.write("epoch", {{"epoch", epoch},
                            {"step", global_step},
                            {"train_loss", summary.train_loss},
                            {"images_per_second", summary.images_per_second},
                            {"train_seconds", train_seconds},
                            {"eval_seconds", eval_seconds},
                            {"test_accuracy", summary.evaluated ? summary.eval.accuracy() : -1.0},
                            {"test_loss", summary.evaluated ? summary.eval.mean_loss() : -1.0},
                            {"data_wait_seconds", loader.stats().wait_seconds - data_wait_before},
                            {"comm_wait_seconds", comm_wait},
                            {"elapsed_seconds", seconds_between(fit_start, Clock::now())}});
    result.epochs.push_back(std::move(summary));
    // A signal during evaluation stops here, after the epoch's checkpoint.
    stopping = any_rank(comm_, stop_requested());
  }

  if (stopping && global_step < last_step) {
    result.status = TrainStatus::kPreempted;
    if (rank == 0) {
      log::warn("stopped by signal {} after step {}; the checkpoint resumes it",
                stop_signal_number(), global_step);
    }
  } else {
    save_checkpoint(epoch, batch_in_epoch);
  }
  result.global_step = global_step;

  std::vector<double> mine{peak_rss_mib()};
  std::vector<double> peaks(world);
  comm_.allgather(mine, peaks);
  metrics.write(
      "end", {{"status",
               std::string(result.status == TrainStatus::kCompleted ? "completed" : "preempted")},
              {"step", global_step},
              {"elapsed_seconds", seconds_between(fit_start, Clock::now())},
              {"peak_rss_mib_per_rank", peaks}});
  return result;
}

}  // namespace ddp::train
