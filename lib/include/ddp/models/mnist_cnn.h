#pragma once
// The classic MNIST CNN of PyTorch's examples: conv3x3(32) - relu - conv3x3(64) - maxpool2 -
// relu - dropout(0.25) - fc(128) - relu - dropout(0.5) - fc(classes). (Pooling before the relu
// is the same function, max and relu commute, on a quarter of the elements.)
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>

#include "ddp/models/classifier.h"

namespace ddp::models {

class MnistCnn : public Classifier {
 public:
  explicit MnistCnn(const ModelSpec& spec);
  at::Tensor forward(const at::Tensor& images) override;

 private:
  torch::nn::Conv2d conv1_{nullptr}, conv2_{nullptr};
  torch::nn::Linear fc1_{nullptr}, fc2_{nullptr};
};

}  // namespace ddp::models
