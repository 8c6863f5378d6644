#include "models/activation_kernels.h"

#include <cstring>
#include <string>

#include "cpu_features.h"
#include "ddp/env_vars.h"
#include "ddp/error.h"

namespace ddp::models::detail {

extern const ActivationKernels kBaselineActivationKernels;
#if defined(DDP_AVX512_KERNELS)
extern const ActivationKernels kAvx512ActivationKernels;
#endif

const ActivationKernels* activation_kernels_for(const char* isa) {
  if (std::strcmp(isa, "baseline") == 0) return &kBaselineActivationKernels;
#if defined(DDP_AVX512_KERNELS)
  static const bool avx512 = ddp::detail::cpu_runs_x86_64_v4();
  if (std::strcmp(isa, "avx512") == 0 && avx512) return &kAvx512ActivationKernels;
#endif
  return nullptr;
}

const ActivationKernels& select_activation_kernels(const char* wanted) {
  if (!wanted) {
    const ActivationKernels* best = activation_kernels_for("avx512");
    return best ? *best : kBaselineActivationKernels;
  }
  const ActivationKernels* named = activation_kernels_for(wanted);
  if (!named) {
    throw ConfigError(
        std::string("DDP_KERNEL_ISA=") + wanted +
        ": this build or CPU has no such kernel variant; use baseline or avx512 "
        "(avx512 needs an x86-64 build and an x86-64-v4 CPU, i.e. AVX-512 F/BW/CD/DQ/VL), or "
        "unset it");
  }
  return *named;
}

const ActivationKernels& activation_kernels() {
  static const ActivationKernels& chosen = []() -> const ActivationKernels& {
    const auto wanted = env::get("DDP_KERNEL_ISA");
    return select_activation_kernels(wanted ? wanted->c_str() : nullptr);
  }();
  return chosen;
}

}  // namespace ddp::models::detail
