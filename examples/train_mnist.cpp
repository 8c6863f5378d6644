// Data-parallel training of the classic MNIST CNN on Fashion-MNIST (Debian's
// dataset-fashion-mnist by default) or MNIST. Run it under ddprun (or torchrun):
//   ddprun --nproc-per-node 2 build/examples/train_mnist --epochs 8
#include <iostream>

#include "ddp/data/mnist.h"
#include "ddp/distributed.h"
#include "ddp/exit_codes.h"
#include "ddp/log.h"
#include "ddp/models/model_spec.h"
#include "ddp/train/trainer.h"
#include "training_flags.h"

namespace {

int train(int argc, char** argv) {
  cxxopts::Options options(
      "train_mnist",
      "Data-parallel training of the MNIST CNN on Fashion-MNIST or MNIST (IDX files, raw or "
      ".gz). Start one process per rank with ddprun or torchrun; alone it trains as one rank.");
  examples::add_training_flags(options, {"mnist_cnn", ddp::data::kDebianFashionMnistDir,
                                         /*epochs=*/8, /*lr=*/0.05});
  options.add_options("Data")("digits", "The files are MNIST digits, not Fashion-MNIST");
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
  const bool digits = flags.count("digits") > 0;
  const std::string dir = flags["data"].as<std::string>();
  const auto& names = digits ? data::mnist_digit_class_names() : data::fashion_mnist_class_names();
  data::ImageDataset train_set = data::load_mnist(dir, data::Split::kTrain, names);
  data::ImageDataset test_set = data::load_mnist(dir, data::Split::kTest, names);
  if (const auto n = flags["train-subset"].as<int64_t>(); n > 0) train_set = train_set.head(n);
  if (const auto n = flags["test-subset"].as<int64_t>(); n > 0) test_set = test_set.head(n);
  trainer_options.data.transform.mean = {digits ? data::kMnistMean : data::kFashionMnistMean};
  trainer_options.data.transform.std = {digits ? data::kMnistStd : data::kFashionMnistStd};

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
