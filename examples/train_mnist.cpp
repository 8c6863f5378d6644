// Data-parallel training of the classic MNIST CNN on Fashion-MNIST (Debian's
// dataset-fashion-mnist by default) or MNIST. Run it under ddprun (or torchrun):
//   ddprun --nproc-per-node 2 build/examples/train_mnist --epochs 8
#include <utility>

#include "ddp/data/mnist.h"
#include "ddp/exit_codes.h"
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
  if (examples::print_help_if_asked(options, flags)) return ddp::exit_code::kSuccess;
  examples::apply_thread_flag(flags);
  ddp::train::TrainerOptions trainer_options = examples::trainer_options_from(flags);
  ddp::ProcessGroup group = ddp::init_process_group();

  namespace data = ddp::data;
  const bool digits = flags.count("digits") > 0;
  const std::string dir = flags["data"].as<std::string>();
  const auto& names = digits ? data::mnist_digit_class_names() : data::fashion_mnist_class_names();
  data::ImageDataset train_set = data::load_mnist(dir, data::Split::kTrain, names);
  data::ImageDataset test_set = data::load_mnist(dir, data::Split::kTest, names);
  trainer_options.data.transform.mean = {digits ? data::kMnistMean : data::kFashionMnistMean};
  trainer_options.data.transform.std = {digits ? data::kMnistStd : data::kFashionMnistStd};

  return examples::train_and_report(flags, group, std::move(train_set), std::move(test_set),
                                    trainer_options);
}

}  // namespace

int main(int argc, char** argv) { return examples::run_main(argc, argv, train); }
