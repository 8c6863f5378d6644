#pragma once
// The loops behind the fused activations (fused_activations.h), on raw memory and without
// torch, so that they can be compiled once per instruction set and chosen at run time: the
// library must load on any x86-64 (and other) CPU, yet on the AVX-512 nodes that train, the
// bfloat16 loops run about twice as fast when the compiler may use AVX-512. Every variant
// computes the same bits (integer rounding, no contracted multiply-adds).
#include <cstdint>

namespace ddp::models::detail {

enum class Precision { kFloat32, kBFloat16 };  // bfloat16 elements are their uint16_t bits

// Dropout for one call: element i of block b is kept (and scaled) when the 16-bit draw
// derived from (seed, b, i) is >= threshold. threshold 0 keeps everything with scale 1.
struct DropoutMask {
  uint64_t seed = 0;
  uint32_t threshold = 0;
  float scale = 1.0f;  // 1 / (1 - p)
};

// A 2x2, stride-2 max pool over B images of C x H x W; OH = H / 2, OW = W / 2. A plain
// aggregate on purpose: no member function that the AVX-512 unit could emit a shared copy of.
struct PoolGeometry {
  int64_t B, C, H, W, OH, OW;
};

struct ActivationKernels {
  const char* isa;  // "baseline", "avx512" or "sve"
  // out = dropout(relu(max_pool2x2(in))), arg = each window's argmax 0..3. `in` and `out` are
  // NCHW or both channels-last. `scratch_floats` / `scratch_draws` hold C * OH * OW floats and
  // C * OH * OW + 3 uint16 draws (one image's outputs).
  void (*pool_forward)(Precision, bool channels_last, const PoolGeometry&, const void* in,
                       void* out, uint8_t* arg, const DropoutMask* mask, float* scratch_floats,
                       uint16_t* scratch_draws);
  // grad_in = grad_out * scale routed to each window's argmax where out != 0; zero elsewhere
  // inside the windows (odd trailing rows/columns are left to the caller).
  void (*pool_backward)(Precision, bool channels_last, const PoolGeometry&, const void* grad_out,
                        const void* out, const uint8_t* arg, void* grad_in, float scale);
  // out = dropout(relu(x)) over rows x cols, one mask block per row; scratch as above for cols.
  void (*relu_dropout_forward)(Precision, const void* x, void* out, int64_t rows, int64_t cols,
                               const DropoutMask* mask, float* scratch_floats,
                               uint16_t* scratch_draws);
  void (*relu_dropout_backward)(Precision, const void* grad_out, const void* out, void* grad_in,
                                int64_t n, float scale);
  // The casts around bfloat16 layers: c10's rounding (nearest even, NaN to 0x7FC0), and the
  // exact widening. ATen's own cast loops run several times slower.
  void (*to_bfloat16)(const float* in, uint16_t* out, int64_t n);
  void (*to_float32)(const uint16_t* in, float* out, int64_t n);
};

// The variant the kernels use, chosen on first use: the fastest this CPU runs under DDP_ISA's
// cap. create_model() calls it, so a bad DDP_ISA fails there, before training.
const ActivationKernels& activation_kernels();

// The fastest variant no wider than `cap` (nullptr: no cap); a cap that is unknown or that the
// CPU cannot run is a ConfigError naming DDP_ISA.
const ActivationKernels& select_activation_kernels(const char* cap);

// A named variant ("baseline", "avx512"), or nullptr when this build or CPU lacks it.
const ActivationKernels* activation_kernels_for(const char* isa);

}  // namespace ddp::models::detail
