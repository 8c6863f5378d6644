#include "models/fused_activations.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <mutex>
#include <vector>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/nn/functional/activation.h>
#include <torch/nn/functional/dropout.h>
#include <torch/nn/functional/pooling.h>

#include "models/activation_kernels.h"

namespace ddp::models::detail {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// One draw from torch's default generator per call: the masks follow torch::manual_seed and the
// generator state saved in checkpoints.
uint64_t next_seed() {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  return at::check_generator<at::CPUGeneratorImpl>(gen)->random64();
}

// The keep threshold on 16-bit draws: exact for p = 0.25 and 0.5, within 8e-6 of p otherwise.
DropoutMask make_mask(double p) {
  DropoutMask m;
  m.seed = next_seed();
  m.threshold = static_cast<uint32_t>(std::min(65536.0, std::round(p * 65536.0)));
  m.scale = static_cast<float>(1.0 / (1.0 - p));
  return m;
}

Precision precision_of(const at::Tensor& x) {
  return x.scalar_type() == at::kFloat ? Precision::kFloat32 : Precision::kBFloat16;
}

// The kernels' scratch for `n` elements per mask block: the multipliers and the 16-bit draws.
struct MaskScratch {
  explicit MaskScratch(int64_t n)
      : multipliers(static_cast<std::size_t>(n)), draws(static_cast<std::size_t>(n + 3)) {}
  std::vector<float> multipliers;
  std::vector<uint16_t> draws;
};

bool supported(const at::Tensor& x) {
  return x.device().is_cpu() &&
         (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16) && x.dim() == 4 &&
         (x.is_contiguous() || x.is_contiguous(at::MemoryFormat::ChannelsLast));
}

// Contiguous wins when a tensor is both (one channel, or 1x1 images).
bool is_channels_last(const at::Tensor& x) { return !x.is_contiguous(); }
at::MemoryFormat format_for(bool channels_last) {
  return channels_last ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
}

struct PoolReluDropout : torch::autograd::Function<PoolReluDropout> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, double p, bool training) {
    const bool drop = training && p > 0.0;
    const bool channels_last = is_channels_last(x);
    auto options = x.options().memory_format(format_for(channels_last));
    at::Tensor out = at::empty({x.size(0), x.size(1), x.size(2) / 2, x.size(3) / 2}, options);
    at::Tensor arg = at::empty(out.sizes(), options.dtype(at::kByte));
    const PoolGeometry g{x.size(0), x.size(1), x.size(2), x.size(3), out.size(2), out.size(3)};
    const DropoutMask mask = drop ? make_mask(p) : DropoutMask{};
    MaskScratch scratch(g.C * g.OH * g.OW);
    activation_kernels().pool_forward(
        precision_of(x), channels_last, g, x.data_ptr(), out.data_ptr(), arg.data_ptr<uint8_t>(),
        drop ? &mask : nullptr, scratch.multipliers.data(), scratch.draws.data());
    ctx->saved_data["channels_last"] = channels_last;
    ctx->save_for_backward({out, arg});
    ctx->saved_data["scale"] = static_cast<double>(mask.scale);
    ctx->saved_data["h"] = x.size(2);
    ctx->saved_data["w"] = x.size(3);
    ctx->mark_non_differentiable({arg});
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& out = saved[0];
    const at::Tensor& arg = saved[1];
    const auto scale = static_cast<float>(ctx->saved_data["scale"].toDouble());
    const bool channels_last = ctx->saved_data["channels_last"].toBool();
    const auto format = format_for(channels_last);
    at::Tensor grad_in = at::empty(
        {out.size(0), out.size(1), ctx->saved_data["h"].toInt(), ctx->saved_data["w"].toInt()},
        out.options().memory_format(format));
    const at::Tensor grad_out = grads[0].contiguous(format);
    const PoolGeometry g{grad_in.size(0), grad_in.size(1), grad_in.size(2),
                         grad_in.size(3), out.size(2),     out.size(3)};
    // Odd trailing rows/columns are outside every window.
    if (g.H != 2 * g.OH || g.W != 2 * g.OW) grad_in.zero_();
    activation_kernels().pool_backward(precision_of(out), channels_last, g, grad_out.data_ptr(),
                                       out.data_ptr(), arg.data_ptr<uint8_t>(), grad_in.data_ptr(),
                                       scale);
    return {grad_in, at::Tensor(), at::Tensor()};
  }
};

// ---- relu + dropout ----

struct ReluDropout : torch::autograd::Function<ReluDropout> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x_in, double p, bool training) {
    const at::Tensor x = x_in.contiguous();
    const bool drop = training && p > 0.0;
    at::Tensor out = at::empty_like(x);
    const DropoutMask mask = drop ? make_mask(p) : DropoutMask{};
    const int64_t cols = x.dim() > 0 ? x.size(-1) : 1;
    const int64_t rows = cols > 0 ? x.numel() / cols : 0;
    MaskScratch scratch(cols);
    activation_kernels().relu_dropout_forward(precision_of(x), x.data_ptr(), out.data_ptr(), rows,
                                              cols, drop ? &mask : nullptr,
                                              scratch.multipliers.data(), scratch.draws.data());
    ctx->save_for_backward({out});
    ctx->saved_data["scale"] = static_cast<double>(mask.scale);
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor out = ctx->get_saved_variables()[0];
    const auto scale = static_cast<float>(ctx->saved_data["scale"].toDouble());
    const at::Tensor grad_out = grads[0].contiguous();
    at::Tensor grad_in = at::empty_like(out);
    activation_kernels().relu_dropout_backward(precision_of(out), grad_out.data_ptr(),
                                               out.data_ptr(), grad_in.data_ptr(), out.numel(),
                                               scale);
    return {grad_in, at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor max_pool2x2_relu_dropout(const at::Tensor& x, double p, bool training) {
  if (!supported(x) || x.size(2) < 2 || x.size(3) < 2) {
    namespace F = torch::nn::functional;
    at::Tensor y = F::relu(F::max_pool2d(x, F::MaxPool2dFuncOptions(2)));
    return F::dropout(y, F::DropoutFuncOptions().p(p).training(training));
  }
  return PoolReluDropout::apply(x, p, training);
}

at::Tensor relu_dropout(const at::Tensor& x, double p, bool training) {
  if (!x.device().is_cpu() || (x.scalar_type() != at::kFloat && x.scalar_type() != at::kBFloat16)) {
    namespace F = torch::nn::functional;
    return F::dropout(F::relu(x), F::DropoutFuncOptions().p(p).training(training));
  }
  return ReluDropout::apply(x, p, training);
}

}  // namespace ddp::models::detail
