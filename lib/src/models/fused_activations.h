#pragma once
// Fused, exact forms of the activation tails of the CNNs, written because ATen runs them as
// separate memory-bound passes (max_pool2d alone costs a quarter of a convolution here):
//   max_pool2x2_relu_dropout(x) == dropout(relu(max_pool2d(x, 2)), p)
//   relu_dropout(x)             == dropout(relu(x), p)
// Same values and gradients as the composite ops (max and relu commute; dropout scales kept
// elements by 1 / (1 - p)); only the dropout mask comes from a faster generator seeded from
// torch's default CPU generator, so torch::manual_seed still makes runs reproducible.
// float32 and bfloat16, contiguous or channels-last; anything else falls back to ATen.
#include <ATen/core/Tensor.h>

namespace ddp::models::detail {

at::Tensor max_pool2x2_relu_dropout(const at::Tensor& x, double p, bool training);
at::Tensor relu_dropout(const at::Tensor& x, double p, bool training);

}  // namespace ddp::models::detail
