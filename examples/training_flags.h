#pragma once
// Command-line flags shared by the training examples and their translation to TrainerOptions.
#include <cstdint>
#include <string>

#include <cxxopts.hpp>

#include "ddp/data/image_dataset.h"
#include "ddp/distributed.h"
#include "ddp/train/trainer.h"

namespace examples {

struct TrainingDefaults {
  std::string model;
  std::string data_dir;
  int64_t epochs;
  double lr;
  std::string optimizer = "sgd";
  double weight_decay = 0;
  bool augment = false;
};

void add_training_flags(cxxopts::Options& options, const TrainingDefaults& defaults);

// Throws ddp::ConfigError for inconsistent values.
ddp::train::TrainerOptions trainer_options_from(const cxxopts::ParseResult& flags);

// --threads, else leaves libtorch's default (OMP_NUM_THREADS, which ddprun sets to 1).
void apply_thread_flag(const cxxopts::ParseResult& flags);

// Prints --help with the exit codes and returns true if it was asked for.
bool print_help_if_asked(const cxxopts::Options& options, const cxxopts::ParseResult& flags);

// What both training examples do once their data is read: cut the splits to --train-subset /
// --test-subset, build --model for them, train, and print rank 0's accuracy table. Returns the
// exit code (75 when stopped by SIGTERM after a checkpoint).
int train_and_report(const cxxopts::ParseResult& flags, ddp::ProcessGroup& group,
                     ddp::data::ImageDataset train_set, ddp::data::ImageDataset test_set,
                     const ddp::train::TrainerOptions& options);

// Runs `body` and turns what escapes it into the documented exit codes (one line on stderr,
// and the torchelastic error file when the launcher asked for one).
int run_main(int argc, char** argv, int (*body)(int, char**));

}  // namespace examples
