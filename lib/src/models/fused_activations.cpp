#include "models/fused_activations.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <mutex>
#include <vector>

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

// Dropout masks. Block `block` (one image's outputs, or one row of a matrix) draws from a
// counter-based SplitMix64 stream: draw j is splitmix64(block_seed + j), independent of every
// other draw, and yields four 16-bit uniforms. The keep probability is 1 - threshold / 65536:
// exact for p = 0.25 and 0.5, within 8e-6 of 1 - p otherwise.
struct MaskStream {
  uint64_t seed = 0;
  uint32_t threshold = 0;  // keep when the 16-bit draw >= threshold
  float scale = 1.0f;      // 1 / (1 - p)

  // multiplier[i] = scale if element i of `block` is kept, else 0.
  void fill(uint64_t block, int64_t n, float* multiplier) const {
    const uint64_t base = splitmix64(seed ^ (block * 0xD1B54A32D192ED03ull));
    const int64_t whole = n / 4;
    for (int64_t j = 0; j < whole; ++j) {
      const uint64_t r = splitmix64(base + static_cast<uint64_t>(j));
      for (int k = 0; k < 4; ++k) {
        multiplier[4 * j + k] = scale * static_cast<float>(((r >> (16 * k)) & 0xFFFF) >= threshold);
      }
    }
    const uint64_t r = splitmix64(base + static_cast<uint64_t>(whole));
    for (int64_t i = 4 * whole; i < n; ++i) {
      multiplier[i] =
          scale * static_cast<float>(((r >> (16 * (i - 4 * whole))) & 0xFFFF) >= threshold);
    }
  }
};

MaskStream make_mask(double p) {
  MaskStream m;
  m.seed = next_seed();
  m.threshold = static_cast<uint32_t>(std::min(65536.0, std::round(p * 65536.0)));
  m.scale = static_cast<float>(1.0 / (1.0 - p));
  return m;
}

bool supported(const at::Tensor& x) {
  return x.device().is_cpu() &&
         (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16) && x.dim() == 4 &&
         (x.is_contiguous() || x.is_contiguous(at::MemoryFormat::ChannelsLast));
}

// ---- max_pool2x2 + relu + dropout ----

// The max of a 2x2 window and its position 0..3, as ATen computes them when no NaN is present:
// the first maximum in row-major order wins. Written as max-selects and integer arithmetic so
// that the compiler emits no branches: on real activations every comparison is a coin flip, and
// mispredicted branches cost three times the arithmetic.
inline float window_max(float v0, float v1, float v2, float v3, uint8_t* index) {
  const int c1 = v1 > v0;
  const float m01 = v1 > v0 ? v1 : v0;
  const int c3 = v3 > v2;
  const float m23 = v3 > v2 ? v3 : v2;
  const int c = m23 > m01;
  *index = static_cast<uint8_t>(c1 + c * (2 + c3 - c1));
  return m23 > m01 ? m23 : m01;
}

// ATen's exact semantics with NaN (it propagates; the last NaN's position), for lines that
// hold one.
inline float window_max_with_nan(float v0, float v1, float v2, float v3, uint8_t* index) {
  const float v[4] = {v0, v1, v2, v3};
  float best = v0;
  uint8_t idx = 0;
  for (uint8_t k = 1; k < 4; ++k) {
    if (v[k] > best || std::isnan(v[k])) best = v[k], idx = k;
  }
  *index = idx;
  return best;
}

inline float relu(float v) { return v > 0.0f ? v : 0.0f; }
inline float relu_with_nan(float v) { return std::isnan(v) ? v : relu(v); }

// One call's shape. Both layouts are handled as "lines": runs of outputs contiguous in memory
// whose windows are evenly spaced in the input. NCHW: a line is an output row, windows 2 apart,
// window neighbours 1 (right) and W (below). NHWC: a line is the C channels of one output pixel,
// windows 1 apart, neighbours C and W * C. The compiler sees the NCHW constants.
struct PoolGeometry {
  int64_t B, C, H, W, OH, OW;
  int64_t per_image() const { return C * OH * OW; }
};

template <bool kChannelsLast>
struct Lines {
  const PoolGeometry& g;
  int64_t count() const { return kChannelsLast ? g.B * g.OH * g.OW : g.B * g.C * g.OH; }
  int64_t length() const { return kChannelsLast ? g.C : g.OW; }
  int64_t step() const { return kChannelsLast ? 1 : 2; }
  int64_t right() const { return kChannelsLast ? g.C : 1; }
  int64_t below() const { return kChannelsLast ? g.W * g.C : g.W; }
  // Input offset of line l's first window (its top-left element); its outputs start at
  // l * length().
  int64_t input_offset(int64_t l) const {
    if (kChannelsLast) {
      const int64_t b = l / (g.OH * g.OW), oy = (l / g.OW) % g.OH, ox = l % g.OW;
      return ((b * g.H + 2 * oy) * g.W + 2 * ox) * g.C;
    }
    return (l / g.OH) * g.H * g.W + 2 * (l % g.OH) * g.W;
  }
};

template <typename T, bool kChannelsLast>
void pool_forward(const PoolGeometry& g, const T* __restrict in, T* __restrict out,
                  uint8_t* __restrict arg, const MaskStream* mask) {
  const Lines<kChannelsLast> lines{g};
  const int64_t n = lines.length(), step = lines.step(), right = lines.right(),
                below = lines.below();
  std::vector<float> multiplier(g.per_image(), 1.0f);
  for (int64_t l = 0; l < lines.count(); ++l) {
    const int64_t first = l * n;
    const int64_t in_image = first % g.per_image();
    if (mask && in_image == 0)
      mask->fill(static_cast<uint64_t>(first / g.per_image()), g.per_image(), multiplier.data());
    const float* m = multiplier.data() + in_image;
    const T* src = in + lines.input_offset(l);
    T* dst = out + first;
    uint8_t* idx = arg + first;
    bool has_nan = false;
    for (int64_t i = 0; i < n; ++i) {
      const T* w = src + i * step;
      const float v0 = static_cast<float>(w[0]), v1 = static_cast<float>(w[right]),
                  v2 = static_cast<float>(w[below]), v3 = static_cast<float>(w[below + right]);
      dst[i] = static_cast<T>(relu(window_max(v0, v1, v2, v3, &idx[i])) * m[i]);
      has_nan |= (v0 != v0) | (v1 != v1) | (v2 != v2) | (v3 != v3);
    }
    if (__builtin_expect(has_nan, 0)) {
      for (int64_t i = 0; i < n; ++i) {
        const T* w = src + i * step;
        const float best = window_max_with_nan(
            static_cast<float>(w[0]), static_cast<float>(w[right]), static_cast<float>(w[below]),
            static_cast<float>(w[below + right]), &idx[i]);
        dst[i] = static_cast<T>(relu_with_nan(best) * m[i]);
      }
    }
  }
}

// grad_in gets grad_out * scale at each window's argmax where the output was non-zero (relu
// passed it and dropout kept it), zero elsewhere: one pass that writes every element.
template <typename T, bool kChannelsLast>
void pool_backward(const PoolGeometry& g, const T* __restrict grad_out, const T* __restrict out,
                   const uint8_t* __restrict arg, T* __restrict grad_in, float scale) {
  const Lines<kChannelsLast> lines{g};
  const int64_t n = lines.length(), step = lines.step(), right = lines.right(),
                below = lines.below();
  for (int64_t l = 0; l < lines.count(); ++l) {
    const int64_t first = l * n;
    T* dst = grad_in + lines.input_offset(l);
    for (int64_t i = 0; i < n; ++i) {
      const float o = static_cast<float>(out[first + i]);
      const float value = o != 0.0f ? static_cast<float>(grad_out[first + i]) * scale : 0.0f;
      const int k = arg[first + i];
      T* w = dst + i * step;
      w[0] = static_cast<T>(k == 0 ? value : 0.0f);
      w[right] = static_cast<T>(k == 1 ? value : 0.0f);
      w[below] = static_cast<T>(k == 2 ? value : 0.0f);
      w[below + right] = static_cast<T>(k == 3 ? value : 0.0f);
    }
  }
}

template <typename T>
void pool_forward(const at::Tensor& x, at::Tensor& out, at::Tensor& arg, const MaskStream* mask,
                  bool channels_last) {
  const PoolGeometry g{x.size(0), x.size(1), x.size(2), x.size(3), out.size(2), out.size(3)};
  if (channels_last) {
    pool_forward<T, true>(g, x.data_ptr<T>(), out.data_ptr<T>(), arg.data_ptr<uint8_t>(), mask);
  } else {
    pool_forward<T, false>(g, x.data_ptr<T>(), out.data_ptr<T>(), arg.data_ptr<uint8_t>(), mask);
  }
}

template <typename T>
void pool_backward(const at::Tensor& grad_out, const at::Tensor& out, const at::Tensor& arg,
                   at::Tensor& grad_in, float scale, bool channels_last) {
  const PoolGeometry g{grad_in.size(0), grad_in.size(1), grad_in.size(2),
                       grad_in.size(3), out.size(2),     out.size(3)};
  // Odd trailing rows/columns are outside every window.
  if (g.H != 2 * g.OH || g.W != 2 * g.OW) grad_in.zero_();
  if (channels_last) {
    pool_backward<T, true>(g, grad_out.data_ptr<T>(), out.data_ptr<T>(), arg.data_ptr<uint8_t>(),
                           grad_in.data_ptr<T>(), scale);
  } else {
    pool_backward<T, false>(g, grad_out.data_ptr<T>(), out.data_ptr<T>(), arg.data_ptr<uint8_t>(),
                            grad_in.data_ptr<T>(), scale);
  }
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
    MaskStream mask;
    if (drop) mask = make_mask(p);
    if (x.scalar_type() == at::kFloat) {
      pool_forward<float>(x, out, arg, drop ? &mask : nullptr, channels_last);
    } else {
      pool_forward<c10::BFloat16>(x, out, arg, drop ? &mask : nullptr, channels_last);
    }
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
    if (out.scalar_type() == at::kFloat) {
      pool_backward<float>(grad_out, out, arg, grad_in, scale, channels_last);
    } else {
      pool_backward<c10::BFloat16>(grad_out, out, arg, grad_in, scale, channels_last);
    }
    return {grad_in, at::Tensor(), at::Tensor()};
  }
};

// ---- relu + dropout ----

template <typename T>
void relu_dropout_forward(const T* __restrict x, T* __restrict out, int64_t rows, int64_t cols,
                          const MaskStream* mask) {
  std::vector<float> multiplier(cols, 1.0f);
  for (int64_t r = 0; r < rows; ++r) {
    if (mask) mask->fill(static_cast<uint64_t>(r), cols, multiplier.data());
    for (int64_t i = 0; i < cols; ++i) {
      out[r * cols + i] =
          static_cast<T>(relu_with_nan(static_cast<float>(x[r * cols + i])) * multiplier[i]);
    }
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
    at::Tensor out = at::empty_like(x);
    MaskStream mask;
    if (drop) mask = make_mask(p);
    const int64_t cols = x.dim() > 0 ? x.size(-1) : 1;
    const int64_t rows = cols > 0 ? x.numel() / cols : 0;
    if (x.scalar_type() == at::kFloat) {
      relu_dropout_forward(x.data_ptr<float>(), out.data_ptr<float>(), rows, cols,
                           drop ? &mask : nullptr);
    } else {
      relu_dropout_forward(x.data_ptr<c10::BFloat16>(), out.data_ptr<c10::BFloat16>(), rows, cols,
                           drop ? &mask : nullptr);
    }
    ctx->save_for_backward({out});
    ctx->saved_data["scale"] = static_cast<double>(mask.scale);
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
