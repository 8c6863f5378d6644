#pragma once
// The CIFAR ResNets of He et al. (2016), depth 6n + 2: a 3x3 stem with 16 channels, three stages
// of n basic blocks with 16, 32 and 64 channels (stride 2 between stages, 1x1 projection
// shortcuts where the shape changes), global average pooling and one linear layer.
#include <vector>

#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>

#include "ddp/models/classifier.h"

namespace ddp::models {

class BasicBlockImpl : public torch::nn::Module {
 public:
  BasicBlockImpl(int64_t in_channels, int64_t out_channels, int64_t stride);
  at::Tensor forward(const at::Tensor& x);

 private:
  torch::nn::Conv2d conv1_{nullptr}, conv2_{nullptr}, shortcut_conv_{nullptr};
  torch::nn::BatchNorm2d bn1_{nullptr}, bn2_{nullptr}, shortcut_bn_{nullptr};
};
TORCH_MODULE(BasicBlock);

class ResNet : public Classifier {
 public:
  // Throws ConfigError unless depth is 6n + 2 for some n >= 1.
  ResNet(const ModelSpec& spec, int depth);
  at::Tensor forward(const at::Tensor& images) override;

 private:
  torch::nn::Conv2d stem_{nullptr};
  torch::nn::BatchNorm2d stem_bn_{nullptr};
  std::vector<BasicBlock> blocks_;
  torch::nn::Linear fc_{nullptr};
};

}  // namespace ddp::models
