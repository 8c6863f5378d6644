#pragma once
// Command-line flags shared by the training examples and their translation to TrainerOptions.
#include <cstdint>
#include <string>

#include <cxxopts.hpp>

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

// Runs `body` and turns what escapes it into the documented exit codes (one line on stderr,
// and the torchelastic error file when the launcher asked for one).
int run_main(int argc, char** argv, int (*body)(int, char**));

}  // namespace examples
