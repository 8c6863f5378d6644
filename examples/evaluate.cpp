// Loads a checkpoint and prints test accuracy overall and per class. Under ddprun the test set
// is sharded across the ranks; alone it scores every image itself.
//   build/examples/evaluate --checkpoint /shared/checkpoints
#include <iostream>

#include <ATen/Parallel.h>
#include <cxxopts.hpp>

#include "ddp/data/cifar10.h"
#include "ddp/data/mnist.h"
#include "ddp/distributed.h"
#include "ddp/error.h"
#include "ddp/exit_codes.h"
#include "ddp/log.h"
#include "ddp/models/model_spec.h"
#include "ddp/train/checkpoint.h"
#include "ddp/train/evaluation.h"
#include "training_flags.h"

namespace {

int run(int argc, char** argv) {
  cxxopts::Options options("evaluate",
                           "Test accuracy (overall and per class) of a training checkpoint. The "
                           "checkpoint names its model; the data directory must hold the test "
                           "split of the dataset it was trained on.");
  // clang-format off
  options.add_options()
    ("checkpoint", "A checkpoint file, or a checkpoint directory (its newest valid checkpoint)",
     cxxopts::value<std::string>())
    ("data", "Test data directory (default: Debian's Fashion-MNIST for 1-channel models)",
     cxxopts::value<std::string>()->default_value(""))
    ("dataset", "fashion-mnist, mnist or cifar10 (default: from the checkpoint's image shape)",
     cxxopts::value<std::string>()->default_value(""))
    ("batch-size", "Images per forward pass", cxxopts::value<int64_t>()->default_value("128"))
    ("bf16", "Evaluate under bfloat16 autocast", cxxopts::value<bool>()->default_value("false"))
    ("threads", "Intra-op threads (default: OMP_NUM_THREADS or all cores)",
     cxxopts::value<int>()->default_value("0"))
    ("h,help", "Show this help");
  // clang-format on
  const auto flags = options.parse(argc, argv);
  if (flags.count("help") || !flags.count("checkpoint")) {
    std::cout << options.help();
    return flags.count("help") ? ddp::exit_code::kSuccess : ddp::exit_code::kConfig;
  }
  if (const int threads = flags["threads"].as<int>(); threads > 0) at::set_num_threads(threads);

  std::string path = flags["checkpoint"].as<std::string>();
  if (!ddp::train::CheckpointDirectory(path, 1).list().empty()) {
    const auto latest = ddp::train::CheckpointDirectory(path, 1).latest_valid();
    if (!latest) throw ddp::DataError(path, "holds no valid checkpoint");
    path = *latest;
  }
  ddp::train::CheckpointMeta meta;
  const auto model = ddp::train::load_model(path, &meta);

  namespace data = ddp::data;
  std::string dataset = flags["dataset"].as<std::string>();
  if (dataset.empty()) dataset = meta.model.in_channels == 3 ? "cifar10" : "fashion-mnist";
  std::string dir = flags["data"].as<std::string>();
  ddp::data::TransformOptions transform;
  data::ImageDataset test_set;
  if (dataset == "cifar10") {
    if (dir.empty()) dir = "cifar-10-batches-bin";
    test_set = data::load_cifar10(dir, data::Split::kTest);
    transform.mean.assign(std::begin(data::kCifar10Mean), std::end(data::kCifar10Mean));
    transform.std.assign(std::begin(data::kCifar10Std), std::end(data::kCifar10Std));
  } else if (dataset == "fashion-mnist" || dataset == "mnist") {
    if (dir.empty()) dir = data::kDebianFashionMnistDir;
    const bool digits = dataset == "mnist";
    test_set = data::load_mnist(
        dir, data::Split::kTest,
        digits ? data::mnist_digit_class_names() : data::fashion_mnist_class_names());
    transform.mean = {digits ? data::kMnistMean : data::kFashionMnistMean};
    transform.std = {digits ? data::kMnistStd : data::kFashionMnistStd};
  } else {
    throw ddp::ConfigError("--dataset '" + dataset +
                           "' is not known; use fashion-mnist, mnist "
                           "or cifar10");
  }
  if (!meta.class_names.empty()) test_set.class_names = meta.class_names;

  ddp::ProcessGroup group = ddp::init_process_group();
  ddp::train::EvalOptions eval;
  eval.batch_size = flags["batch-size"].as<int64_t>();
  eval.transform = transform;
  eval.bf16 = flags["bf16"].as<bool>();
  const auto result = ddp::train::evaluate(*model, test_set, eval, group.comm.get());
  if (group.env.rank == 0) {
    std::cout << "checkpoint " << path << " (" << meta.model.name << ", epoch " << meta.epoch
              << ", step " << meta.global_step << ")\n"
              << ddp::train::format_accuracy_table(result, test_set.class_names);
  }
  return ddp::exit_code::kSuccess;
}

}  // namespace

int main(int argc, char** argv) { return examples::run_main(argc, argv, run); }
