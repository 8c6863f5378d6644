#pragma once
// Optimizers by name, so that programs choose them from a flag: SGD with (Nesterov) momentum and
// Adam, each with weight decay.
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

namespace torch::optim {
class Optimizer;
}

namespace ddp::train {

struct OptimizerOptions {
  std::string name = "sgd";  // "sgd" or "adam"
  double lr = 0.05;
  double momentum = 0.9;  // sgd
  bool nesterov = false;  // sgd
  double weight_decay = 0.0;
  double beta1 = 0.9;  // adam
  double beta2 = 0.999;
  double eps = 1e-8;
};

// Throws ConfigError for an unknown name or an out-of-range value.
std::unique_ptr<torch::optim::Optimizer> make_optimizer(const std::vector<at::Tensor>& parameters,
                                                        const OptimizerOptions& options);

// Sets the learning rate of every parameter group.
void set_learning_rate(torch::optim::Optimizer& optimizer, double lr);

}  // namespace ddp::train
