#pragma once
// The fused activation loops, included by exactly one translation unit per instruction set
// (activation_kernels_<isa>.cpp), which compiles them with its own target flags. Everything is
// in an anonymous namespace and uses no library templates or member functions of shared types:
// an inline function with external linkage, emitted here with AVX-512 enabled (as unoptimised
// builds do), could be the copy the linker keeps for the whole library and then fault on a CPU
// without it. A test checks that the AVX-512 object defines nothing but its table.
#include <cstdint>
#include <cstring>

#include "base/bfloat16_bits.h"
#include "models/activation_kernels.h"

namespace ddp::models::detail {
namespace {

inline int64_t outputs_per_image(const PoolGeometry& g) { return g.C * g.OH * g.OW; }

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
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
// multiplier[i] = scale if element i of `block` is kept, else 0. Two passes, the draws and then
// the comparisons, so that both vectorise; the mask's fields are read into locals first, or
// the stores through `multiplier` (which might alias them) keep the loop scalar and branchy.
inline void fill_mask(const DropoutMask& mask, uint64_t block, int64_t n, float* multiplier,
                      uint16_t* draws) {
  const uint64_t base = splitmix64(mask.seed ^ (block * 0xD1B54A32D192ED03ull));
  const int64_t words = (n + 3) / 4;
  for (int64_t j = 0; j < words; ++j) {
    const uint64_t r = splitmix64(base + static_cast<uint64_t>(j));
    for (int k = 0; k < 4; ++k) draws[4 * j + k] = static_cast<uint16_t>(r >> (16 * k));
  }
  const uint32_t keep_from = mask.threshold;
  const float kept = mask.scale;
  for (int64_t i = 0; i < n; ++i) multiplier[i] = keep_if(draws[i] >= keep_from, kept);
}

// ---- element conversions ----

// bfloat16 is handled as its raw bits (bfloat16_bits.h).
inline float to_float(float v) { return v; }
inline float to_float(uint16_t bits) { return ddp::detail::bfloat16_bits_to_float(bits); }

template <typename E>
inline E from_float(float v);
template <>
inline float from_float<float>(float v) {
  return v;
}
template <>
inline uint16_t from_float<uint16_t>(float v) {
  return ddp::detail::float_to_bfloat16_bits(v);
}

inline bool is_nan(float v) { return v != v; }
inline float relu(float v) { return v > 0.0f ? v : 0.0f; }
inline float relu_with_nan(float v) { return is_nan(v) ? v : relu(v); }

// The gradient that reaches an input of ReLU + dropout: scaled where the output survived (is
// non-zero), +0 elsewhere.
inline float kept_gradient(float out, float grad, float scale) {
  return keep_if(out != 0.0f, grad * scale);
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
    if (v[k] > best || is_nan(v[k])) best = v[k], idx = k;
  }
  *index = idx;
  return best;
}

// Both layouts are handled as "lines": runs of outputs contiguous in memory whose windows are
// evenly spaced in the input. NCHW: a line is an output row, windows 2 apart, window
// neighbours 1 (right) and W (below). NHWC: a line is the C channels of one output pixel,
// windows 1 apart, neighbours C and W * C. The compiler sees the NCHW constants.
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
                  uint8_t* __restrict arg, const DropoutMask* mask, float* multiplier,
                  uint16_t* draws) {
  const Lines<kChannelsLast> lines{g};
  const int64_t n = lines.length(), step = lines.step(), right = lines.right(),
                below = lines.below();
  if (!mask) {
    for (int64_t i = 0; i < outputs_per_image(g); ++i) multiplier[i] = 1.0f;
  }
  LineWalker<kChannelsLast> walker(g);
  int64_t image = 0, in_image = 0;  // of the line's first output
  for (int64_t l = 0; l < lines.count(); ++l, walker.next()) {
    const int64_t first = l * n;
    if (mask && in_image == 0) {
      fill_mask(*mask, static_cast<uint64_t>(image), outputs_per_image(g), multiplier, draws);
    }
    const float* m = multiplier + in_image;
    in_image += n;
    if (in_image == outputs_per_image(g)) in_image = 0, ++image;
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

// ---- relu + dropout ----

template <typename T>
void relu_dropout_forward(const T* __restrict x, T* __restrict out, int64_t rows, int64_t cols,
                          const DropoutMask* mask, float* multiplier, uint16_t* draws) {
  if (!mask) {
    for (int64_t i = 0; i < cols; ++i) multiplier[i] = 1.0f;
  }
  for (int64_t r = 0; r < rows; ++r) {
    if (mask) fill_mask(*mask, static_cast<uint64_t>(r), cols, multiplier, draws);
    for (int64_t i = 0; i < cols; ++i) {
      out[r * cols + i] = from_float<T>(relu_with_nan(to_float(x[r * cols + i])) * multiplier[i]);
    }
  }
}

template <typename T>
void relu_dropout_backward(const T* __restrict grad_out, const T* __restrict out,
                           T* __restrict grad_in, int64_t n, float scale) {
  for (int64_t i = 0; i < n; ++i) {
    grad_in[i] = from_float<T>(kept_gradient(to_float(out[i]), to_float(grad_out[i]), scale));
  }
}

// ---- the table's entries: dispatch on element type and layout ----

void pool_forward_entry(Precision precision, bool channels_last, const PoolGeometry& g,
                        const void* in, void* out, uint8_t* arg, const DropoutMask* mask,
                        float* scratch_floats, uint16_t* scratch_draws) {
  if (precision == Precision::kFloat32) {
    auto* i = static_cast<const float*>(in);
    auto* o = static_cast<float*>(out);
    channels_last ? pool_forward<float, true>(g, i, o, arg, mask, scratch_floats, scratch_draws)
                  : pool_forward<float, false>(g, i, o, arg, mask, scratch_floats, scratch_draws);
  } else {
    auto* i = static_cast<const uint16_t*>(in);
    auto* o = static_cast<uint16_t*>(out);
    channels_last
        ? pool_forward<uint16_t, true>(g, i, o, arg, mask, scratch_floats, scratch_draws)
        : pool_forward<uint16_t, false>(g, i, o, arg, mask, scratch_floats, scratch_draws);
  }
}

void pool_backward_entry(Precision precision, bool channels_last, const PoolGeometry& g,
                         const void* grad_out, const void* out, const uint8_t* arg, void* grad_in,
                         float scale) {
  if (precision == Precision::kFloat32) {
    auto* go = static_cast<const float*>(grad_out);
    auto* o = static_cast<const float*>(out);
    auto* gi = static_cast<float*>(grad_in);
    channels_last ? pool_backward<float, true>(g, go, o, arg, gi, scale)
                  : pool_backward<float, false>(g, go, o, arg, gi, scale);
  } else {
    auto* go = static_cast<const uint16_t*>(grad_out);
    auto* o = static_cast<const uint16_t*>(out);
    auto* gi = static_cast<uint16_t*>(grad_in);
    channels_last ? pool_backward<uint16_t, true>(g, go, o, arg, gi, scale)
                  : pool_backward<uint16_t, false>(g, go, o, arg, gi, scale);
  }
}

void relu_dropout_forward_entry(Precision precision, const void* x, void* out, int64_t rows,
                                int64_t cols, const DropoutMask* mask, float* scratch_floats,
                                uint16_t* scratch_draws) {
  if (precision == Precision::kFloat32) {
    relu_dropout_forward(static_cast<const float*>(x), static_cast<float*>(out), rows, cols, mask,
                         scratch_floats, scratch_draws);
  } else {
    relu_dropout_forward(static_cast<const uint16_t*>(x), static_cast<uint16_t*>(out), rows, cols,
                         mask, scratch_floats, scratch_draws);
  }
}

void relu_dropout_backward_entry(Precision precision, const void* grad_out, const void* out,
                                 void* grad_in, int64_t n, float scale) {
  if (precision == Precision::kFloat32) {
    relu_dropout_backward(static_cast<const float*>(grad_out), static_cast<const float*>(out),
                          static_cast<float*>(grad_in), n, scale);
  } else {
    relu_dropout_backward(static_cast<const uint16_t*>(grad_out), static_cast<const uint16_t*>(out),
                          static_cast<uint16_t*>(grad_in), n, scale);
  }
}

void to_bfloat16_entry(const float* __restrict in, uint16_t* __restrict out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = from_float<uint16_t>(in[i]);
}

void to_float32_entry(const uint16_t* __restrict in, float* __restrict out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = to_float(in[i]);
}

constexpr ActivationKernels make_kernel_table(const char* isa) {
  return {isa,
          pool_forward_entry,
          pool_backward_entry,
          relu_dropout_forward_entry,
          relu_dropout_backward_entry,
          to_bfloat16_entry,
          to_float32_entry};
}

}  // namespace
}  // namespace ddp::models::detail
