#include "models/activation_kernels.h"

#include <cstring>
#include <string>

#include "base/cpu_features.h"
#include "ddp/error.h"

namespace ddp::models::detail {

extern const ActivationKernels kBaselineActivationKernels;
#if defined(DDP_AVX512_KERNELS)
extern const ActivationKernels kAvx512ActivationKernels;
#endif
#if defined(DDP_SVE_KERNELS)
extern const ActivationKernels kSveActivationKernels;
#endif

const ActivationKernels* activation_kernels_for(const char* isa) {
  if (std::strcmp(isa, "baseline") == 0) return &kBaselineActivationKernels;
#if defined(DDP_AVX512_KERNELS)
  static const bool avx512 = ddp::detail::cpu_runs_x86_64_v4();
  if (std::strcmp(isa, "avx512") == 0 && avx512) return &kAvx512ActivationKernels;
#endif
#if defined(DDP_SVE_KERNELS)
  static const bool sve = ddp::detail::cpu_runs_sve();
  if (std::strcmp(isa, "sve") == 0 && sve) return &kSveActivationKernels;
#endif
  return nullptr;
}

const ActivationKernels& select_activation_kernels(const char* cap) {
  if (cap) ddp::detail::check_isa_cap(cap);
  // The widest allowed set with a variant (none for avx2: an avx2 cap takes the baseline).
  for (int i = ddp::detail::kernel_isa_count() - 1; i > 0; --i) {
    const char* isa = ddp::detail::kernel_isa(i);
    if (!ddp::detail::isa_allowed(isa, cap)) continue;
    if (const ActivationKernels* fast = activation_kernels_for(isa)) return *fast;
  }
  return kBaselineActivationKernels;
}

const ActivationKernels& activation_kernels() {
  static const ActivationKernels& chosen = []() -> const ActivationKernels& {
    const auto cap = ddp::detail::isa_cap();
    return select_activation_kernels(cap ? cap->c_str() : nullptr);
  }();
  return chosen;
}

}  // namespace ddp::models::detail
