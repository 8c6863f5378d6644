#pragma once
// The interface every image classifier in ddp implements: a torch::nn::Module whose forward maps
// a float batch [B, C, H, W] to logits [B, num_classes]. The trainer, evaluation and checkpoints
// work through it; DistributedDataParallel itself takes any torch::nn::Module.
#include <string>

#include <torch/nn/module.h>

#include "ddp/models/model_spec.h"

namespace ddp::models {

class Classifier : public torch::nn::Module {
 public:
  explicit Classifier(ModelSpec spec) : spec_(std::move(spec)) {}
  virtual at::Tensor forward(const at::Tensor& images) = 0;
  // What it was built from: checkpoints store it so that evaluation can rebuild the model.
  const ModelSpec& spec() const { return spec_; }

 private:
  ModelSpec spec_;
};

}  // namespace ddp::models
