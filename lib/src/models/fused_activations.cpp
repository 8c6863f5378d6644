#include "models/fused_activations.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <type_traits>
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

// `v` if `keep`, else +0: written with a bit mask, because GCC does not if-convert the select.
inline float keep_if(bool keep, float v) {
  uint32_t u;
  std::memcpy(&u, &v, sizeof(u));
  u &= 0u - static_cast<uint32_t>(keep);
  std::memcpy(&v, &u, sizeof(v));
  return v;
}

// Dropout masks. Block `block` (one image's outputs, or one row of a matrix) draws from a
// counter-based SplitMix64 stream: draw j is splitmix64(block_seed + j), independent of every
// other draw, and yields four 16-bit uniforms. The keep probability is 1 - threshold / 65536:
// exact for p = 0.25 and 0.5, within 8e-6 of 1 - p otherwise.
struct MaskStream {
  uint64_t seed = 0;
  uint32_t threshold = 0;  // keep when the 16-bit draw >= threshold
  float scale = 1.0f;      // 1 / (1 - p)

  // multiplier[i] = scale if element i of `block` is kept, else 0. Two passes: the draws (64-bit
  // arithmetic, scalar) and then the comparisons, which vectorise.
  void fill(uint64_t block, int64_t n, float* multiplier) {
    const uint64_t base = splitmix64(seed ^ (block * 0xD1B54A32D192ED03ull));
    uniforms.resize(static_cast<std::size_t>((n + 3) / 4 * 4));
    for (std::size_t j = 0; j < uniforms.size() / 4; ++j) {
      const uint64_t r = splitmix64(base + j);
      for (int k = 0; k < 4; ++k) uniforms[4 * j + k] = static_cast<uint16_t>(r >> (16 * k));
    }
    // Locals, so that the stores through `multiplier` cannot alias them: with the members
    // read in the loop it stays scalar and branches on every (unpredictable) draw.
    const uint32_t keep_from = threshold;
    const float kept = scale;
    const uint16_t* draw = uniforms.data();
    for (int64_t i = 0; i < n; ++i) multiplier[i] = keep_if(draw[i] >= keep_from, kept);
  }

 private:
  std::vector<uint16_t> uniforms;  // the draws of the current block, reused across blocks
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

// The kernels see bfloat16 as its raw bits (uint16_t): GCC vectorises loops over scalars but
// not over c10::BFloat16 objects. The conversions have no branches for the same reason;
// float -> bfloat16 gives c10's bits (round to nearest even, every NaN to 0x7FC0).
template <typename T>
using Element = std::conditional_t<std::is_same_v<T, float>, float, uint16_t>;

template <typename T>
Element<T>* elements(const at::Tensor& t) {
  return reinterpret_cast<Element<T>*>(t.data_ptr<T>());
}

inline float to_float(float v) { return v; }
inline float to_float(uint16_t bits) {
  const uint32_t widened = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &widened, sizeof(f));
  return f;
}

// The gradient that reaches an input of ReLU + dropout: scaled where the output survived (is
// non-zero), +0 elsewhere.
inline float kept_gradient(float out, float grad, float scale) {
  return keep_if(out != 0.0f, grad * scale);
}

template <typename E>
inline E from_float(float v);
template <>
inline float from_float<float>(float v) {
  return v;
}
template <>
inline uint16_t from_float<uint16_t>(float v) {
  uint32_t u;
  std::memcpy(&u, &v, sizeof(u));
  const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  const bool nan = (u & 0x7FFFFFFFu) > 0x7F800000u;
  return static_cast<uint16_t>(nan ? 0x7FC0u : rounded);
}

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
};

// Input offset of each line's first window (its top-left element), line after line; line l's
// outputs start at l * length(). Counted up rather than derived from l: the divisions that
// would take cost more than a short line's work.
template <bool kChannelsLast>
class LineWalker {
 public:
  explicit LineWalker(const PoolGeometry& g) : g_(g) {}
  int64_t offset() const { return offset_; }
  void next() {
    if (kChannelsLast) {  // lines: image, output row, output column
      if (++column_ < g_.OW) {
        offset_ += 2 * g_.C;
        return;
      }
      column_ = 0;
      if (++row_ == g_.OH) row_ = 0, ++plane_;
      offset_ = (plane_ * g_.H + 2 * row_) * g_.W * g_.C;
    } else {  // lines: image and channel (a plane), output row
      if (++row_ < g_.OH) {
        offset_ += 2 * g_.W;
        return;
      }
      row_ = 0;
      ++plane_;
      offset_ = plane_ * g_.H * g_.W;
    }
  }

 private:
  const PoolGeometry& g_;
  int64_t plane_ = 0, row_ = 0, column_ = 0, offset_ = 0;
};

template <typename T, bool kChannelsLast>
void pool_forward(const PoolGeometry& g, const T* __restrict in, T* __restrict out,
                  uint8_t* __restrict arg, MaskStream* mask) {
  const Lines<kChannelsLast> lines{g};
  const int64_t n = lines.length(), step = lines.step(), right = lines.right(),
                below = lines.below();
  std::vector<float> multiplier(g.per_image(), 1.0f);
  LineWalker<kChannelsLast> walker(g);
  int64_t image = 0, in_image = 0;  // of the line's first output
  for (int64_t l = 0; l < lines.count(); ++l, walker.next()) {
    const int64_t first = l * n;
    if (mask && in_image == 0) {
      mask->fill(static_cast<uint64_t>(image), g.per_image(), multiplier.data());
    }
    const float* m = multiplier.data() + in_image;
    in_image += n;
    if (in_image == g.per_image()) in_image = 0, ++image;
    const T* src = in + walker.offset();
    T* dst = out + first;
    uint8_t* idx = arg + first;
    const T* top = src;
    const T* top_right = src + right;
    const T* bottom = src + below;
    const T* bottom_right = src + below + right;
    int nans = 0;
    for (int64_t i = 0; i < n; ++i) {
      const float v0 = to_float(top[i * step]), v1 = to_float(top_right[i * step]),
                  v2 = to_float(bottom[i * step]), v3 = to_float(bottom_right[i * step]);
      dst[i] = from_float<T>(relu(window_max(v0, v1, v2, v3, &idx[i])) * m[i]);
      nans += (v0 != v0) + (v1 != v1) + (v2 != v2) + (v3 != v3);
    }
    if (__builtin_expect(nans != 0, 0)) {
      for (int64_t i = 0; i < n; ++i) {
        const T* w = src + i * step;
        const float best =
            window_max_with_nan(to_float(w[0]), to_float(w[right]), to_float(w[below]),
                                to_float(w[below + right]), &idx[i]);
        dst[i] = from_float<T>(relu_with_nan(best) * m[i]);
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
  LineWalker<kChannelsLast> walker(g);
  for (int64_t l = 0; l < lines.count(); ++l, walker.next()) {
    const int64_t first = l * n;
    T* dst = grad_in + walker.offset();
    for (int64_t i = 0; i < n; ++i) {
      const float value =
          kept_gradient(to_float(out[first + i]), to_float(grad_out[first + i]), scale);
      const int k = arg[first + i];
      T* w = dst + i * step;
      w[0] = from_float<T>(keep_if(k == 0, value));
      w[right] = from_float<T>(keep_if(k == 1, value));
      w[below] = from_float<T>(keep_if(k == 2, value));
      w[below + right] = from_float<T>(keep_if(k == 3, value));
    }
  }
}

template <typename T>
void pool_forward(const at::Tensor& x, at::Tensor& out, at::Tensor& arg, MaskStream* mask,
                  bool channels_last) {
  const PoolGeometry g{x.size(0), x.size(1), x.size(2), x.size(3), out.size(2), out.size(3)};
  if (channels_last) {
    pool_forward<Element<T>, true>(g, elements<T>(x), elements<T>(out), arg.data_ptr<uint8_t>(),
                                   mask);
  } else {
    pool_forward<Element<T>, false>(g, elements<T>(x), elements<T>(out), arg.data_ptr<uint8_t>(),
                                    mask);
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
    pool_backward<Element<T>, true>(g, elements<T>(grad_out), elements<T>(out),
                                    arg.data_ptr<uint8_t>(), elements<T>(grad_in), scale);
  } else {
    pool_backward<Element<T>, false>(g, elements<T>(grad_out), elements<T>(out),
                                     arg.data_ptr<uint8_t>(), elements<T>(grad_in), scale);
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
                          MaskStream* mask) {
  std::vector<float> multiplier(cols, 1.0f);
  for (int64_t r = 0; r < rows; ++r) {
    if (mask) mask->fill(static_cast<uint64_t>(r), cols, multiplier.data());
    for (int64_t i = 0; i < cols; ++i) {
      out[r * cols + i] = from_float<T>(relu_with_nan(to_float(x[r * cols + i])) * multiplier[i]);
    }
  }
}

template <typename T>
void relu_dropout_backward(const T* grad_out, const T* out, T* grad_in, int64_t n, float scale) {
  for (int64_t i = 0; i < n; ++i) {
    grad_in[i] = from_float<T>(kept_gradient(to_float(out[i]), to_float(grad_out[i]), scale));
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
      relu_dropout_forward(elements<c10::BFloat16>(x), elements<c10::BFloat16>(out), rows, cols,
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
      relu_dropout_backward(elements<c10::BFloat16>(grad_out), elements<c10::BFloat16>(out),
                            elements<c10::BFloat16>(grad_in), out.numel(), scale);
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
