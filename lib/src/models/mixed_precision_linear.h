#pragma once
// A linear layer's forward that gives what torch::linear gives, bit for bit, with or without
// CPU autocast to bfloat16. Under autocast it computes the same bfloat16 product, but casts the
// float32 weight to bfloat16 (and its gradient back) in the library's vectorised loops: ATen's
// cast loops took a quarter of a bfloat16 MNIST step's non-convolution time (fc1's 1.2 M
// weights, once each way per step).
#include <ATen/core/Tensor.h>

namespace ddp::models::detail {

at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias);

}  // namespace ddp::models::detail
