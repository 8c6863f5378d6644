#pragma once
// Names a model architecture and the data shape it is built for, and creates it. Light on
// purpose (no torch headers), so programs that only pick a model by name compile quickly.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace ddp::models {

class Classifier;

struct ModelSpec {
  std::string name;  // one of model_names()
  int64_t in_channels = 1;
  int64_t height = 28;
  int64_t width = 28;
  int64_t num_classes = 10;
};

// "mnist_cnn", "cifar_cnn", "resnet8", "resnet20", "resnet32", "resnet56".
std::vector<std::string> model_names();

// Builds the model with weights drawn from torch's default generator, seeded with `seed` first
// (ranks that pass the same seed start identical; DistributedDataParallel makes them so anyway).
// Throws ConfigError for an unknown name or a shape the architecture cannot take.
std::shared_ptr<Classifier> create_model(const ModelSpec& spec, uint64_t seed = 0);

}  // namespace ddp::models
