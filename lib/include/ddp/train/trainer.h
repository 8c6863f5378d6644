#pragma once
// Data-parallel training of an image classifier, end to end: sharded and prefetched data,
// DistributedDataParallel, an optimizer with a learning-rate schedule, sharded evaluation each
// epoch with a per-class accuracy table, a rank-0 progress line and JSONL metrics, checkpoints
// (atomic, every N steps and at each epoch's end) with automatic resume from the newest valid
// one, and a graceful stop on SIGTERM: finish the step, checkpoint, report kPreempted.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ddp/data/data_loader.h"
#include "ddp/data/image_dataset.h"
#include "ddp/parallel/distributed_data_parallel.h"
#include "ddp/train/evaluation.h"
#include "ddp/train/lr_schedule.h"
#include "ddp/train/optimizer.h"

namespace ddp {
class Communicator;
struct ProcessGroup;
}  // namespace ddp
namespace ddp::models {
class Classifier;
}

namespace ddp::train {

struct TrainerOptions {
  int64_t epochs = 5;
  // Stop after this many optimizer steps in all (checkpointing first); 0 for no limit.
  int64_t max_steps = 0;
  data::LoaderOptions data;  // per-rank batch size, normalisation, augmentation, prefetch
  // Evaluation activations dominate peak memory: 500 images of the MNIST CNN hold ~150 MiB more
  // than 128, and the smaller batch also evaluates faster (it stays in cache).
  int64_t eval_batch_size = 128;
  bool evaluate_each_epoch = true;
  OptimizerOptions optimizer;
  LrScheduleOptions schedule;
  uint64_t seed = 0;  // model initialisation is the caller's; this seeds data order and dropout
  DdpOptions ddp;
  bool bf16 = false;  // bfloat16 autocast for forward passes (weights and optimizer stay fp32)
  // After a resume at a smaller world size (an elastic job that shrank): keep the global batch
  // of the world the training began with by accumulating the gradients of k = reference /
  // world micro-batches (rounded, at least 1) per optimizer step, instead of keeping the
  // per-rank batch and scaling the learning rate down. The rate is scaled by world x k /
  // reference, 1 when the sizes divide. Without it (the default), the rate scales with the
  // world size. A world larger than the reference takes k = 1 either way.
  bool keep_global_batch = false;

  std::string checkpoint_dir;    // empty: no checkpoints
  int64_t checkpoint_every = 0;  // steps between checkpoints; 0: only at epoch ends
  int keep_checkpoints = 3;
  bool resume = true;  // continue from the newest valid checkpoint in checkpoint_dir

  std::string metrics_path;  // JSONL, written by rank 0; empty: none
  int64_t log_every = 100;   // steps between progress lines; 0: none
  // Straggler reports: every this many steps the ranks share their compute and wait time per
  // step, rank 0 names each rank whose compute exceeds the median by `straggler_threshold` (a
  // warning line and a "ranks" metrics record); 0: none. Unset: DDP_STRAGGLER_WINDOW (100) and
  // DDP_STRAGGLER_PERCENT (120, i.e. 1.2).
  std::optional<int64_t> straggler_window;
  std::optional<double> straggler_threshold;
  // After how many seconds of waiting in one collective ddprun diagnoses a hang (the agents
  // gather every rank's flight recorder and name the rank holding the others up); 0: never.
  // Unset: DDP_HANG_WARN_SEC (60). Applied to the communicator when the Trainer is built.
  std::optional<int64_t> hang_warn_sec;
  // A timeline of steps "A:B" (numbered from 1; "" for none): each rank writes a Chrome trace
  // (trace-rank<R>.json) of its data wait, forward, backward, optimizer step, checkpoint and
  // every collective, into `trace_dir` (unset: DDP_TRACE_DIR, which ddprun sets and then merges
  // the ranks' files into one, else the current directory).
  std::string trace_steps;
  std::string trace_dir;
  bool handle_signals = true;
  // Keep freed memory in the heap (see resource_usage.h); a process-wide malloc setting.
  bool tune_malloc = true;
};

enum class TrainStatus {
  kCompleted,  // all epochs (or max_steps) done
  kPreempted,  // stopped by SIGTERM/SIGINT after checkpointing; rerunning resumes
};

struct EpochSummary {
  int64_t epoch = 0;
  double train_loss = 0;         // mean over this rank's batches
  double images_per_second = 0;  // all ranks, training only
  double seconds = 0;            // training part of the epoch
  bool evaluated = false;
  EvalResult eval;
};

struct TrainResult {
  TrainStatus status = TrainStatus::kCompleted;
  int64_t global_step = 0;
  int64_t resumed_from_step = -1;  // -1: started fresh
  // The rank whose checkpoint was sent to ranks that had none as new (a volume per pod); -1:
  // every rank read its own (a shared volume), or none resumed. After a regroup: the rank whose
  // state in memory the new world took.
  int state_from_rank = -1;
  // The worlds this process regrouped into in-process (ProcessGroup::regroup), each a change of
  // members that cost no restart and no checkpoint read.
  int regroups = 0;
  // The step each of those worlds began from (the newest step any rank had applied).
  std::vector<int64_t> regrouped_at;
  std::vector<EpochSummary> epochs;  // epochs finished in this run
};

class Trainer {
 public:
  // `model` freshly built on every rank (rank 0's initial weights win); the datasets are shared
  // by all ranks in full (each rank reads its own shard). `comm` must outlive the trainer.
  Trainer(Communicator& comm, std::shared_ptr<models::Classifier> model,
          data::ImageDataset train_set, data::ImageDataset test_set, TrainerOptions options);
  // The same on `group`, which must outlive the trainer: in a job ddprun launched, the trainer
  // then regroups in-process on a membership change (ddp/distributed.h). It abandons the step in
  // flight (a node lost) or stops after the same step as every rank (a node joins), keeps the
  // model, optimizer and position in memory, joins the next world, and goes on from the newest
  // state any rank holds, sent by broadcast to the ranks that lack it (the joiners). No restart,
  // no libtorch start-up, no checkpoint read.
  Trainer(ProcessGroup& group, std::shared_ptr<models::Classifier> model,
          data::ImageDataset train_set, data::ImageDataset test_set, TrainerOptions options);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // Trains to the end, to max_steps, or until a stop signal. Collective: every rank calls it.
  TrainResult fit();

 private:
  // fit() on a group that regroups: one run per world.
  TrainResult fit_regrouping();

  Communicator* comm_;
  ProcessGroup* group_ = nullptr;
  std::shared_ptr<models::Classifier> model_;
  data::ImageDataset train_set_;
  data::ImageDataset test_set_;
  TrainerOptions options_;
};

}  // namespace ddp::train
