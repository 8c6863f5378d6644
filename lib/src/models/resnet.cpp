#include "ddp/models/resnet.h"

#include <torch/nn/functional/activation.h>
#include <torch/nn/init.h>

#include "ddp/error.h"
#include "models/mixed_precision_linear.h"

namespace ddp::models {
namespace {

namespace nn = torch::nn;

nn::Conv2d conv3x3(int64_t in, int64_t out, int64_t stride) {
  return nn::Conv2d(nn::Conv2dOptions(in, out, 3).stride(stride).padding(1).bias(false));
}

}  // namespace

BasicBlockImpl::BasicBlockImpl(int64_t in_channels, int64_t out_channels, int64_t stride) {
  conv1_ = register_module("conv1", conv3x3(in_channels, out_channels, stride));
  bn1_ = register_module("bn1", nn::BatchNorm2d(out_channels));
  conv2_ = register_module("conv2", conv3x3(out_channels, out_channels, 1));
  bn2_ = register_module("bn2", nn::BatchNorm2d(out_channels));
  if (stride != 1 || in_channels != out_channels) {
    shortcut_conv_ = register_module(
        "shortcut_conv",
        nn::Conv2d(nn::Conv2dOptions(in_channels, out_channels, 1).stride(stride).bias(false)));
    shortcut_bn_ = register_module("shortcut_bn", nn::BatchNorm2d(out_channels));
  }
}

at::Tensor BasicBlockImpl::forward(const at::Tensor& x) {
  namespace F = nn::functional;
  at::Tensor out = F::relu(bn1_(conv1_(x)));
  out = bn2_(conv2_(out));
  out = out + (shortcut_conv_ ? shortcut_bn_(shortcut_conv_(x)) : x);
  return F::relu(out);
}

ResNet::ResNet(const ModelSpec& spec, int depth) : Classifier(spec) {
  if (depth < 8 || (depth - 2) % 6 != 0) {
    throw ConfigError("ResNet depth " + std::to_string(depth) +
                      " is not 6n + 2 (8, 14, 20, 32, 44, 56, ...)");
  }
  const int n = (depth - 2) / 6;
  stem_ = register_module("stem", conv3x3(spec.in_channels, 16, 1));
  stem_bn_ = register_module("stem_bn", nn::BatchNorm2d(16));
  int64_t channels = 16;
  for (int stage = 0; stage < 3; ++stage) {
    const int64_t out = 16 << stage;
    for (int b = 0; b < n; ++b) {
      const int64_t stride = (stage > 0 && b == 0) ? 2 : 1;
      blocks_.push_back(
          register_module("layer" + std::to_string(stage + 1) + "_" + std::to_string(b),
                          BasicBlock(channels, out, stride)));
      channels = out;
    }
  }
  fc_ = register_module("fc", nn::Linear(channels, spec.num_classes));
  // He initialisation for convolutions, as torchvision's ResNets.
  for (auto& m : modules(/*include_self=*/false)) {
    if (auto* conv = m->as<nn::Conv2d>()) {
      nn::init::kaiming_normal_(conv->weight, 0.0, torch::kFanOut, torch::kReLU);
    }
  }
}

at::Tensor ResNet::forward(const at::Tensor& images) {
  namespace F = nn::functional;
  at::Tensor x = F::relu(stem_bn_(stem_(images)));
  for (auto& block : blocks_) x = block(x);
  x = x.mean({2, 3});  // global average pooling
  return detail::linear(x, fc_->weight, fc_->bias);
}

}  // namespace ddp::models
