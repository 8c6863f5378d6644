#include "ddp/models/cifar_cnn.h"

#include <torch/nn/functional/activation.h>
#include <torch/nn/init.h>

#include "ddp/error.h"
#include "models/fused_activations.h"
#include "models/mixed_precision_linear.h"

namespace ddp::models {

CifarCnn::CifarCnn(const ModelSpec& spec) : Classifier(spec) {
  if (spec.height < 4 || spec.width < 4) {
    throw ConfigError("cifar_cnn needs images of at least 4x4 pixels, got " +
                      std::to_string(spec.height) + "x" + std::to_string(spec.width));
  }
  namespace nn = torch::nn;
  auto conv = [](int64_t in, int64_t out) {
    return nn::Conv2d(nn::Conv2dOptions(in, out, 3).padding(1));
  };
  conv1_ = register_module("conv1", conv(spec.in_channels, 32));
  conv2_ = register_module("conv2", conv(32, 32));
  conv3_ = register_module("conv3", conv(32, 64));
  conv4_ = register_module("conv4", conv(64, 64));
  fc1_ = register_module("fc1", nn::Linear(64 * (spec.height / 4) * (spec.width / 4), 512));
  fc2_ = register_module("fc2", nn::Linear(512, spec.num_classes));
  // He initialisation: with torch's default (a = sqrt(5)) this 4-conv stack starts with vanishing
  // activations and barely moves in its first hundred steps.
  for (auto* conv : {&conv1_, &conv2_, &conv3_, &conv4_}) {
    nn::init::kaiming_normal_((*conv)->weight, 0.0, torch::kFanOut, torch::kReLU);
    nn::init::zeros_((*conv)->bias);
  }
}

at::Tensor CifarCnn::forward(const at::Tensor& images) {
  namespace F = torch::nn::functional;
  at::Tensor x = F::relu(conv1_(images));
  x = detail::max_pool2x2_relu_dropout(conv2_(x), 0.25, is_training());
  x = F::relu(conv3_(x));
  x = detail::max_pool2x2_relu_dropout(conv4_(x), 0.25, is_training());
  x = detail::relu_dropout(detail::linear(x.flatten(1), fc1_->weight, fc1_->bias), 0.5,
                           is_training());
  return detail::linear(x, fc2_->weight, fc2_->bias);
}

}  // namespace ddp::models
