#pragma once
// A compact VGG-style CIFAR-10 CNN: two blocks of [conv3x3 - relu - conv3x3 - maxpool2 - relu -
// dropout(0.25)] with 32 and 64 channels, then fc(512) - relu - dropout(0.5) - fc(classes).
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>

#include "ddp/models/classifier.h"

namespace ddp::models {

class CifarCnn : public Classifier {
 public:
  explicit CifarCnn(const ModelSpec& spec);
  at::Tensor forward(const at::Tensor& images) override;

 private:
  torch::nn::Conv2d conv1_{nullptr}, conv2_{nullptr}, conv3_{nullptr}, conv4_{nullptr};
  torch::nn::Linear fc1_{nullptr}, fc2_{nullptr};
};

}  // namespace ddp::models
