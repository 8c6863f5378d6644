// Data-parallel training on CIFAR-10 (binary version, cifar-10-batches-bin) with the compact CNN
// or a CIFAR ResNet, random-crop and flip augmentation on by default. Under ddprun:
//   ddprun --nproc-per-node 2 build/examples/train_cifar10 --data cifar-10-batches-bin
#include <utility>

#include "ddp/data/cifar10.h"
#include "ddp/exit_codes.h"
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
  if (examples::print_help_if_asked(options, flags)) return ddp::exit_code::kSuccess;
  examples::apply_thread_flag(flags);
  ddp::train::TrainerOptions trainer_options = examples::trainer_options_from(flags);
  ddp::ProcessGroup group = ddp::init_process_group();

  namespace data = ddp::data;
  const std::string dir = flags["data"].as<std::string>();
  data::ImageDataset train_set = data::load_cifar10(dir, data::Split::kTrain);
  data::ImageDataset test_set = data::load_cifar10(dir, data::Split::kTest);
  trainer_options.data.transform.mean.assign(std::begin(data::kCifar10Mean),
                                             std::end(data::kCifar10Mean));
  trainer_options.data.transform.std.assign(std::begin(data::kCifar10Std),
                                            std::end(data::kCifar10Std));

  return examples::train_and_report(flags, group, std::move(train_set), std::move(test_set),
                                    trainer_options);
}

}  // namespace

int main(int argc, char** argv) { return examples::run_main(argc, argv, train); }
