// Data-parallel training on CIFAR-10 (binary version, cifar-10-batches-bin) with the compact CNN
// or a CIFAR ResNet, random-crop and flip augmentation on by default. Under ddprun:
//   ddprun --nproc-per-node 2 build/examples/train_cifar10 --data cifar-10-batches-bin
#include <iostream>

#include "ddp/data/cifar10.h"
#include "ddp/distributed.h"
#include "ddp/exit_codes.h"
#include "ddp/models/model_spec.h"
#include "ddp/train/trainer.h"
#include "training_flags.h"

namespace {

int train(int argc, char** argv) {
  cxxopts::Options options(
      "train_cifar10",
      "Data-parallel training on CIFAR-10 (binary version: data_batch_1..5.bin, test_batch.bin, "
      "batches.meta.txt). Start one process per rank with ddprun or torchrun.");
  examples::TrainingDefaults defaults{"resnet20", "cifar-10-batches-bin", /*epochs=*/30,
                                      /*lr=*/0.1};
  defaults.weight_decay = 5e-4;
  defaults.augment = true;
  examples::add_training_flags(options, defaults);
  const auto flags = options.parse(argc, argv);
  if (flags.count("help")) {
    std::cout << options.help()
              << "\nExit codes: 0 done, 64 bad flag, 65 bad data, 70 "
                 "communication failure, 75 stopped by SIGTERM after a "
                 "checkpoint (rerun to resume).\n";
    return ddp::exit_code::kSuccess;
  }
  examples::apply_thread_flag(flags);
  ddp::train::TrainerOptions trainer_options = examples::trainer_options_from(flags);
  ddp::ProcessGroup group = ddp::init_process_group();

  namespace data = ddp::data;
  const std::string dir = flags["data"].as<std::string>();
  data::ImageDataset train_set = data::load_cifar10(dir, data::Split::kTrain);
  data::ImageDataset test_set = data::load_cifar10(dir, data::Split::kTest);
  if (const auto n = flags["train-subset"].as<int64_t>(); n > 0) train_set = train_set.head(n);
  if (const auto n = flags["test-subset"].as<int64_t>(); n > 0) test_set = test_set.head(n);
  trainer_options.data.transform.mean.assign(std::begin(data::kCifar10Mean),
                                             std::end(data::kCifar10Mean));
  trainer_options.data.transform.std.assign(std::begin(data::kCifar10Std),
                                            std::end(data::kCifar10Std));

  auto model =
      ddp::models::create_model({flags["model"].as<std::string>(), train_set.channels(),
                                 train_set.height(), train_set.width(), train_set.num_classes()},
                                trainer_options.seed);
  ddp::train::Trainer trainer(*group.comm, model, train_set, test_set, trainer_options);
  const ddp::train::TrainResult result = trainer.fit();
  if (result.status == ddp::train::TrainStatus::kPreempted) return ddp::exit_code::kPreempted;
  if (group.env.rank == 0 && !result.epochs.empty() && result.epochs.back().evaluated) {
    std::cout << ddp::train::format_accuracy_table(result.epochs.back().eval, test_set.class_names);
  }
  return ddp::exit_code::kSuccess;
}

}  // namespace

int main(int argc, char** argv) { return examples::run_main(argc, argv, train); }
