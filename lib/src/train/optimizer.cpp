#include "ddp/train/optimizer.h"

#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>

#include "ddp/error.h"

namespace ddp::train {

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const std::vector<at::Tensor>& parameters,
                                                        const OptimizerOptions& o) {
  if (!(o.lr > 0)) throw ConfigError("learning rate must be positive, got " + std::to_string(o.lr));
  if (!(o.weight_decay >= 0)) throw ConfigError("weight decay must not be negative");
  if (o.name == "sgd") {
    if (o.momentum < 0 || o.momentum >= 1) throw ConfigError("SGD momentum must be in [0, 1)");
    if (o.nesterov && o.momentum == 0) throw ConfigError("Nesterov SGD needs a momentum > 0");
    return std::make_unique<torch::optim::SGD>(parameters, torch::optim::SGDOptions(o.lr)
                                                               .momentum(o.momentum)
                                                               .nesterov(o.nesterov)
                                                               .weight_decay(o.weight_decay));
  }
  if (o.name == "adam") {
    // torch::optim would reject these with a c10::Error; a bad option is a configuration error.
    if (!(o.beta1 >= 0 && o.beta1 < 1) || !(o.beta2 >= 0 && o.beta2 < 1)) {
      throw ConfigError("Adam betas must be in [0, 1), got (" + std::to_string(o.beta1) + ", " +
                        std::to_string(o.beta2) + ")");
    }
    if (!(o.eps >= 0)) throw ConfigError("Adam eps must not be negative");
    return std::make_unique<torch::optim::Adam>(parameters, torch::optim::AdamOptions(o.lr)
                                                                .betas({o.beta1, o.beta2})
                                                                .eps(o.eps)
                                                                .weight_decay(o.weight_decay));
  }
  throw ConfigError("unknown optimizer '" + o.name + "'; choose sgd or adam");
}

void set_learning_rate(torch::optim::Optimizer& optimizer, double lr) {
  for (auto& group : optimizer.param_groups()) group.options().set_lr(lr);
}

}  // namespace ddp::train
