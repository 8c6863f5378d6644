#include "ddp/models/mnist_cnn.h"

#include <torch/nn/functional/activation.h>

#include "ddp/error.h"
#include "models/fused_activations.h"
#include "models/mixed_precision_linear.h"

namespace ddp::models {

MnistCnn::MnistCnn(const ModelSpec& spec) : Classifier(spec) {
  if (spec.height < 6 || spec.width < 6) {
    throw ConfigError("mnist_cnn needs images of at least 6x6 pixels, got " +
                      std::to_string(spec.height) + "x" + std::to_string(spec.width));
  }
  namespace nn = torch::nn;
  conv1_ = register_module("conv1", nn::Conv2d(nn::Conv2dOptions(spec.in_channels, 32, 3)));
  conv2_ = register_module("conv2", nn::Conv2d(nn::Conv2dOptions(32, 64, 3)));
  const int64_t features = 64 * ((spec.height - 4) / 2) * ((spec.width - 4) / 2);
  fc1_ = register_module("fc1", nn::Linear(features, 128));
  fc2_ = register_module("fc2", nn::Linear(128, spec.num_classes));
}

at::Tensor MnistCnn::forward(const at::Tensor& images) {
  at::Tensor x = torch::nn::functional::relu(conv1_(images));
  x = detail::max_pool2x2_relu_dropout(conv2_(x), 0.25, is_training());
  x = detail::relu_dropout(detail::linear(x.flatten(1), fc1_->weight, fc1_->bias), 0.5,
                           is_training());
  return detail::linear(x, fc2_->weight, fc2_->bias);
}

}  // namespace ddp::models
