#include "training_flags.h"

#include <iostream>

#include <ATen/Parallel.h>

#include "ddp/error.h"
#include "ddp/error_file.h"
#include "ddp/exit_codes.h"
#include "ddp/log.h"
#include "ddp/models/model_spec.h"

namespace examples {

void add_training_flags(cxxopts::Options& options, const TrainingDefaults& d) {
  // clang-format off
  options.add_options("Data")
    ("data", "Dataset directory", cxxopts::value<std::string>()->default_value(d.data_dir))
    ("train-subset", "Train on the first N training images only (0: all)",
     cxxopts::value<int64_t>()->default_value("0"))
    ("test-subset", "Evaluate on the first N test images only (0: all)",
     cxxopts::value<int64_t>()->default_value("0"))
    ("batch-size", "Images per rank per step", cxxopts::value<int64_t>()->default_value("64"))
    ("eval-batch-size", "Images per rank per evaluation forward pass (bounds its memory)",
     cxxopts::value<int64_t>()->default_value("128"))
    ("augment", "Random crop (4-pixel padding) and horizontal flip",
     cxxopts::value<bool>()->default_value(d.augment ? "true" : "false"))
    ("prefetch", "Batches prepared ahead by the loader thread",
     cxxopts::value<int>()->default_value("2"));
  options.add_options("Model and optimisation")
    ("model", "Architecture: mnist_cnn, cifar_cnn, resnet8/20/32/56",
     cxxopts::value<std::string>()->default_value(d.model))
    ("epochs", "Passes over the training set", cxxopts::value<int64_t>()->default_value(std::to_string(d.epochs)))
    ("max-steps", "Stop after N optimizer steps in all (0: no limit)",
     cxxopts::value<int64_t>()->default_value("0"))
    ("optimizer", "sgd or adam", cxxopts::value<std::string>()->default_value(d.optimizer))
    ("lr", "Peak learning rate", cxxopts::value<double>()->default_value(std::to_string(d.lr)))
    ("momentum", "SGD momentum", cxxopts::value<double>()->default_value("0.9"))
    ("nesterov", "Nesterov momentum", cxxopts::value<bool>()->default_value("false"))
    ("weight-decay", "L2 weight decay",
     cxxopts::value<double>()->default_value(std::to_string(d.weight_decay)))
    ("schedule", "Learning-rate schedule: cosine, step or constant",
     cxxopts::value<std::string>()->default_value("cosine"))
    ("warmup-steps", "Linear warm-up steps", cxxopts::value<int64_t>()->default_value("0"))
    ("step-epochs", "step schedule: decay every N epochs", cxxopts::value<int64_t>()->default_value("30"))
    ("step-gamma", "step schedule: decay factor", cxxopts::value<double>()->default_value("0.1"))
    ("seed", "Seed of initial weights, data order, augmentation and dropout",
     cxxopts::value<uint64_t>()->default_value("0"))
    ("keep-global-batch", "After resuming with fewer ranks (an elastic job that shrank), keep "
     "the starting world's global batch by gradient accumulation instead of scaling the "
     "learning rate down")
    ("bf16", "bfloat16 mixed precision (CPU autocast, channels-last)",
     cxxopts::value<bool>()->default_value("false"))
    ("threads", "Intra-op threads per rank (default: OMP_NUM_THREADS or all cores)",
     cxxopts::value<int>()->default_value("0"));
  options.add_options("Distributed")
    ("bucket-cap-mb", "Gradient bucket size in MiB (the first bucket is 1 MiB)",
     cxxopts::value<double>()->default_value("25"))
    ("no-overlap", "Allreduce gradients after backward instead of during it")
    ("compress", "Gradient compression on the wire: none or bf16",
     cxxopts::value<std::string>()->default_value("none"));
  options.add_options("Checkpoints and output")
    ("checkpoint-dir", "Directory for checkpoints (shared by all ranks); resumes from it",
     cxxopts::value<std::string>()->default_value(""))
    ("checkpoint-every", "Also checkpoint every N steps (0: at epoch ends only)",
     cxxopts::value<int64_t>()->default_value("0"))
    ("keep-checkpoints", "Newest checkpoints kept", cxxopts::value<int>()->default_value("3"))
    ("no-resume", "Start fresh even if the checkpoint directory has checkpoints")
    ("metrics", "Append JSONL metrics to this file (rank 0)",
     cxxopts::value<std::string>()->default_value(""))
    ("log-every", "Steps between progress lines (0: none)",
     cxxopts::value<int64_t>()->default_value("100"))
    ("straggler-window", "Steps between straggler reports (0: none; default "
     "DDP_STRAGGLER_WINDOW, else 100)", cxxopts::value<int64_t>())
    ("straggler-threshold", "Name a rank whose compute per step exceeds the median rank's by "
     "this ratio (default DDP_STRAGGLER_PERCENT / 100, else 1.2)", cxxopts::value<double>())
    ("trace-steps", "Write a Chrome trace of steps A:B (numbered from 1) per rank: data wait, "
     "forward, backward, optimizer, checkpoint and every collective", cxxopts::value<std::string>())
    ("trace-dir", "Folder of the traces (default DDP_TRACE_DIR, which ddprun sets and merges, "
     "else the current directory)", cxxopts::value<std::string>())
    ("hang-warn-sec", "Under ddprun: diagnose a hang once a collective has waited this many "
     "seconds (0: never; default DDP_HANG_WARN_SEC, else 60)", cxxopts::value<int64_t>())
    ("h,help", "Show this help");
  // clang-format on
}

ddp::train::TrainerOptions trainer_options_from(const cxxopts::ParseResult& f) {
  ddp::train::TrainerOptions o;
  o.epochs = f["epochs"].as<int64_t>();
  o.max_steps = f["max-steps"].as<int64_t>();
  o.data.batch_size = f["batch-size"].as<int64_t>();
  o.eval_batch_size = f["eval-batch-size"].as<int64_t>();
  if (o.data.batch_size <= 0 || o.eval_batch_size <= 0) {
    throw ddp::ConfigError("--batch-size and --eval-batch-size must be positive");
  }
  o.data.prefetch = f["prefetch"].as<int>();
  o.data.transform.random_crop_flip = f["augment"].as<bool>();
  o.bf16 = f["bf16"].as<bool>();
  o.keep_global_batch = f.count("keep-global-batch") > 0;
  o.data.transform.channels_last = o.bf16;
  o.optimizer.name = f["optimizer"].as<std::string>();
  o.optimizer.lr = f["lr"].as<double>();
  o.optimizer.momentum = f["momentum"].as<double>();
  o.optimizer.nesterov = f["nesterov"].as<bool>();
  o.optimizer.weight_decay = f["weight-decay"].as<double>();
  o.schedule.name = f["schedule"].as<std::string>();
  o.schedule.warmup_steps = f["warmup-steps"].as<int64_t>();
  o.schedule.step_epochs = f["step-epochs"].as<int64_t>();
  o.schedule.step_gamma = f["step-gamma"].as<double>();
  o.seed = f["seed"].as<uint64_t>();
  const double cap = f["bucket-cap-mb"].as<double>();
  if (!(cap > 0)) throw ddp::ConfigError("--bucket-cap-mb must be positive");
  o.ddp.bucket_cap_bytes = static_cast<std::size_t>(cap * 1024 * 1024);
  o.ddp.overlap = f.count("no-overlap") == 0;
  const std::string compress = f["compress"].as<std::string>();
  if (compress == "bf16") {
    o.ddp.compression = ddp::GradientCompression::kBFloat16;
  } else if (compress != "none") {
    throw ddp::ConfigError("--compress '" + compress + "' is not known; use none or bf16");
  }
  o.checkpoint_dir = f["checkpoint-dir"].as<std::string>();
  o.checkpoint_every = f["checkpoint-every"].as<int64_t>();
  o.keep_checkpoints = f["keep-checkpoints"].as<int>();
  o.resume = f.count("no-resume") == 0;
  o.metrics_path = f["metrics"].as<std::string>();
  o.log_every = f["log-every"].as<int64_t>();
  if (f.count("straggler-window")) o.straggler_window = f["straggler-window"].as<int64_t>();
  if (f.count("trace-steps")) o.trace_steps = f["trace-steps"].as<std::string>();
  if (f.count("trace-dir")) o.trace_dir = f["trace-dir"].as<std::string>();
  if (f.count("hang-warn-sec")) o.hang_warn_sec = f["hang-warn-sec"].as<int64_t>();
  if (f.count("straggler-threshold")) {
    o.straggler_threshold = f["straggler-threshold"].as<double>();
  }
  return o;
}

void apply_thread_flag(const cxxopts::ParseResult& flags) {
  const int threads = flags["threads"].as<int>();
  if (threads < 0) throw ddp::ConfigError("--threads must not be negative");
  if (threads > 0) at::set_num_threads(threads);
}

bool print_help_if_asked(const cxxopts::Options& options, const cxxopts::ParseResult& flags) {
  if (!flags.count("help")) return false;
  std::cout << options.help()
            << "\nExit codes: 0 done, 64 bad flag, 65 bad data, 70 communication failure, 75 "
               "stopped by SIGTERM after a checkpoint (rerun to resume).\n";
  return true;
}

int train_and_report(const cxxopts::ParseResult& flags, ddp::ProcessGroup& group,
                     ddp::data::ImageDataset train_set, ddp::data::ImageDataset test_set,
                     const ddp::train::TrainerOptions& options) {
  if (const auto n = flags["train-subset"].as<int64_t>(); n > 0) train_set = train_set.head(n);
  if (const auto n = flags["test-subset"].as<int64_t>(); n > 0) test_set = test_set.head(n);
  auto model =
      ddp::models::create_model({flags["model"].as<std::string>(), train_set.channels(),
                                 train_set.height(), train_set.width(), train_set.num_classes()},
                                options.seed);
  // On the group: under ddprun, an elastic change regroups the trainer in-process.
  ddp::train::Trainer trainer(group, model, train_set, test_set, options);
  const ddp::train::TrainResult result = trainer.fit();
  if (result.status == ddp::train::TrainStatus::kPreempted) return ddp::exit_code::kPreempted;
  if (group.env.rank == 0 && !result.epochs.empty() && result.epochs.back().evaluated) {
    std::cout << ddp::train::format_accuracy_table(result.epochs.back().eval, test_set.class_names);
  }
  return ddp::exit_code::kSuccess;
}

int run_main(int argc, char** argv, int (*body)(int, char**)) {
  try {
    return body(argc, argv);
  } catch (const cxxopts::exceptions::exception& e) {
    ddp::log::error("{} (see --help)", e.what());
    ddp::record_error(ddp::ConfigError(std::string(e.what()) + " (see --help)"));
    return ddp::exit_code::kConfig;
  } catch (const std::exception& e) {
    ddp::log::error("{}", e.what());
    ddp::record_error(e);  // ddprun reports this message as the root cause
    return ddp::exit_code::for_exception(e);
  }
}

}  // namespace examples
