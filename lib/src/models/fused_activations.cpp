#include "models/fused_activations.h"

#include <cmath>
#include <cstdint>
#include <mutex>

#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/BFloat16.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/nn/functional/activation.h>
#include <torch/nn/functional/dropout.h>
#include <torch/nn/functional/pooling.h>

namespace ddp::models::detail {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// One draw from torch's default generator per call: the masks follow torch::manual_seed and the
// generator state saved in checkpoints.
uint64_t next_seed() {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  return at::check_generator<at::CPUGeneratorImpl>(gen)->random64();
}

// Element i is kept with probability 1 - p: counter-based, so any element's bit is computable
// independently (the loops below vectorise).
struct MaskStream {
  uint64_t seed;
  uint32_t threshold;  // keep when the 32-bit draw >= threshold
  bool keep(int64_t i) const {
    const uint64_t r = splitmix64(seed + static_cast<uint64_t>(i >> 1));
    const auto bits = static_cast<uint32_t>((i & 1) ? (r >> 32) : r);
    return bits >= threshold;
  }
};

MaskStream make_mask(double p) {
  return {next_seed(),
          static_cast<uint32_t>(p * 4294967296.0 > 4294967295.0 ? 4294967295.0 : p * 4294967296.0)};
}

bool supported(const at::Tensor& x) {
  return x.device().is_cpu() &&
         (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16) && x.dim() == 4 &&
         (x.is_contiguous() || x.is_contiguous(at::MemoryFormat::ChannelsLast));
}

// ---- max_pool2x2 + relu + dropout ----

// Output element (b, c, oy, ox) at linear position `o` in the output's own memory order; the
// window's argmax (0..3, row-major in the window) goes to `arg`, so backward needs no input.
template <typename T>
void pool_forward(const at::Tensor& x, at::Tensor& out, at::Tensor& arg, const MaskStream* mask,
                  float scale) {
  const int64_t B = x.size(0), C = x.size(1), OH = out.size(2), OW = out.size(3);
  const int64_t xsB = x.stride(0), xsC = x.stride(1), xsH = x.stride(2), xsW = x.stride(3);
  const int64_t osB = out.stride(0), osC = out.stride(1), osH = out.stride(2), osW = out.stride(3);
  const T* in = x.data_ptr<T>();
  T* o = out.data_ptr<T>();
  uint8_t* a = arg.data_ptr<uint8_t>();
  const bool channels_last = xsC == 1;
  auto one = [&](int64_t b, int64_t c, int64_t oy, int64_t ox) {
    const T* w = in + b * xsB + c * xsC + (2 * oy) * xsH + (2 * ox) * xsW;
    const float v0 = static_cast<float>(w[0]), v1 = static_cast<float>(w[xsW]),
                v2 = static_cast<float>(w[xsH]), v3 = static_cast<float>(w[xsH + xsW]);
    float best = v0;
    uint8_t idx = 0;
    // As ATen: the first maximum in row-major window order wins, and NaN propagates.
    if (v1 > best || std::isnan(v1)) best = v1, idx = 1;
    if (v2 > best || std::isnan(v2)) best = v2, idx = 2;
    if (v3 > best || std::isnan(v3)) best = v3, idx = 3;
    const int64_t pos = b * osB + c * osC + oy * osH + ox * osW;
    float value = (best > 0.0f || std::isnan(best)) ? best : 0.0f;
    if (mask) value = mask->keep(pos) ? value * scale : 0.0f;
    o[pos] = static_cast<T>(value);
    a[pos] = idx;
  };
  if (channels_last) {
    for (int64_t b = 0; b < B; ++b)
      for (int64_t oy = 0; oy < OH; ++oy)
        for (int64_t ox = 0; ox < OW; ++ox)
          for (int64_t c = 0; c < C; ++c) one(b, c, oy, ox);
  } else {
    for (int64_t b = 0; b < B; ++b)
      for (int64_t c = 0; c < C; ++c)
        for (int64_t oy = 0; oy < OH; ++oy)
          for (int64_t ox = 0; ox < OW; ++ox) one(b, c, oy, ox);
  }
}

// grad_in gets grad_out * scale at each window's argmax where the output was non-zero (relu
// passed it and dropout kept it), zero everywhere else: one pass that writes every element.
template <typename T>
void pool_backward(const at::Tensor& grad_out, const at::Tensor& out, const at::Tensor& arg,
                   at::Tensor& grad_in, float scale) {
  const int64_t B = out.size(0), C = out.size(1), OH = out.size(2), OW = out.size(3);
  const int64_t H = grad_in.size(2), W = grad_in.size(3);
  const int64_t gsB = grad_in.stride(0), gsC = grad_in.stride(1), gsH = grad_in.stride(2),
                gsW = grad_in.stride(3);
  const int64_t osB = out.stride(0), osC = out.stride(1), osH = out.stride(2), osW = out.stride(3);
  const int64_t dsB = grad_out.stride(0), dsC = grad_out.stride(1), dsH = grad_out.stride(2),
                dsW = grad_out.stride(3);
  const T* go = grad_out.data_ptr<T>();
  const T* o = out.data_ptr<T>();
  const uint8_t* a = arg.data_ptr<uint8_t>();
  T* gi = grad_in.data_ptr<T>();
  // Odd trailing rows/columns are outside every window.
  if (H != 2 * OH || W != 2 * OW) grad_in.zero_();
  const bool channels_last = gsC == 1;
  auto one = [&](int64_t b, int64_t c, int64_t oy, int64_t ox) {
    const int64_t pos = b * osB + c * osC + oy * osH + ox * osW;
    const float g = static_cast<float>(o[pos]) != 0.0f
                        ? static_cast<float>(go[b * dsB + c * dsC + oy * dsH + ox * dsW]) * scale
                        : 0.0f;
    const uint8_t idx = a[pos];
    T* w = gi + b * gsB + c * gsC + (2 * oy) * gsH + (2 * ox) * gsW;
    w[0] = static_cast<T>(idx == 0 ? g : 0.0f);
    w[gsW] = static_cast<T>(idx == 1 ? g : 0.0f);
    w[gsH] = static_cast<T>(idx == 2 ? g : 0.0f);
    w[gsH + gsW] = static_cast<T>(idx == 3 ? g : 0.0f);
  };
  if (channels_last) {
    for (int64_t b = 0; b < B; ++b)
      for (int64_t oy = 0; oy < OH; ++oy)
        for (int64_t ox = 0; ox < OW; ++ox)
          for (int64_t c = 0; c < C; ++c) one(b, c, oy, ox);
  } else {
    for (int64_t b = 0; b < B; ++b)
      for (int64_t c = 0; c < C; ++c)
        for (int64_t oy = 0; oy < OH; ++oy)
          for (int64_t ox = 0; ox < OW; ++ox) one(b, c, oy, ox);
  }
}

at::MemoryFormat format_of(const at::Tensor& x) {
  return x.is_contiguous() ? at::MemoryFormat::Contiguous : at::MemoryFormat::ChannelsLast;
}

struct PoolReluDropout : torch::autograd::Function<PoolReluDropout> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, double p, bool training) {
    const bool drop = training && p > 0.0;
    const float scale = drop ? static_cast<float>(1.0 / (1.0 - p)) : 1.0f;
    const auto format = format_of(x);
    auto options = x.options().memory_format(format);
    at::Tensor out = at::empty({x.size(0), x.size(1), x.size(2) / 2, x.size(3) / 2}, options);
    at::Tensor arg = at::empty(out.sizes(), options.dtype(at::kByte));
    MaskStream mask{};
    if (drop) mask = make_mask(p);
    if (x.scalar_type() == at::kFloat) {
      pool_forward<float>(x, out, arg, drop ? &mask : nullptr, scale);
    } else {
      pool_forward<c10::BFloat16>(x, out, arg, drop ? &mask : nullptr, scale);
    }
    ctx->save_for_backward({out, arg});
    ctx->saved_data["scale"] = static_cast<double>(scale);
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
    at::Tensor grad_in = at::empty(
        {out.size(0), out.size(1), ctx->saved_data["h"].toInt(), ctx->saved_data["w"].toInt()},
        out.options().memory_format(format_of(out)));
    const at::Tensor grad_out = grads[0].contiguous(format_of(out));
    if (out.scalar_type() == at::kFloat) {
      pool_backward<float>(grad_out, out, arg, grad_in, scale);
    } else {
      pool_backward<c10::BFloat16>(grad_out, out, arg, grad_in, scale);
    }
    return {grad_in, at::Tensor(), at::Tensor()};
  }
};

// ---- relu + dropout ----

template <typename T>
void relu_dropout_forward(const T* x, T* out, int64_t n, const MaskStream* mask, float scale) {
  for (int64_t i = 0; i < n; ++i) {
    float v = static_cast<float>(x[i]);
    v = (v > 0.0f || std::isnan(v)) ? v : 0.0f;
    if (mask) v = mask->keep(i) ? v * scale : 0.0f;
    out[i] = static_cast<T>(v);
  }
}

template <typename T>
void relu_dropout_backward(const T* grad_out, const T* out, T* grad_in, int64_t n, float scale) {
  for (int64_t i = 0; i < n; ++i) {
    grad_in[i] = static_cast<T>(
        static_cast<float>(out[i]) != 0.0f ? static_cast<float>(grad_out[i]) * scale : 0.0f);
  }
}

struct ReluDropout : torch::autograd::Function<ReluDropout> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x_in, double p, bool training) {
    const at::Tensor x = x_in.contiguous();
    const bool drop = training && p > 0.0;
    const float scale = drop ? static_cast<float>(1.0 / (1.0 - p)) : 1.0f;
    at::Tensor out = at::empty_like(x);
    MaskStream mask{};
    if (drop) mask = make_mask(p);
    if (x.scalar_type() == at::kFloat) {
      relu_dropout_forward(x.data_ptr<float>(), out.data_ptr<float>(), x.numel(),
                           drop ? &mask : nullptr, scale);
    } else {
      relu_dropout_forward(x.data_ptr<c10::BFloat16>(), out.data_ptr<c10::BFloat16>(), x.numel(),
                           drop ? &mask : nullptr, scale);
    }
    ctx->save_for_backward({out});
    ctx->saved_data["scale"] = static_cast<double>(scale);
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor out = ctx->get_saved_variables()[0];
    const auto scale = static_cast<float>(ctx->saved_data["scale"].toDouble());
    const at::Tensor grad_out = grads[0].contiguous();
    at::Tensor grad_in = at::empty_like(out);
    if (out.scalar_type() == at::kFloat) {
      relu_dropout_backward(grad_out.data_ptr<float>(), out.data_ptr<float>(),
                            grad_in.data_ptr<float>(), out.numel(), scale);
    } else {
      relu_dropout_backward(grad_out.data_ptr<c10::BFloat16>(), out.data_ptr<c10::BFloat16>(),
                            grad_in.data_ptr<c10::BFloat16>(), out.numel(), scale);
    }
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
