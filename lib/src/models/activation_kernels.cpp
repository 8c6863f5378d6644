#include "models/activation_kernels.h"

#include <cstring>
#include <string>

#include "ddp/env_vars.h"
#include "ddp/error.h"

namespace ddp::models::detail {

extern const ActivationKernels kBaselineActivationKernels;
#if defined(DDP_AVX512_KERNELS)
extern const ActivationKernels kAvx512ActivationKernels;
#endif

namespace {

#if defined(DDP_AVX512_KERNELS)
// Everything -march=x86-64-v4 lets the compiler use, not only the AVX-512 subsets it happens to.
bool cpu_has_avx512() {
  __builtin_cpu_init();
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
  return __builtin_cpu_supports("x86-64-v4");
#else
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
         __builtin_cpu_supports("avx512cd") && __builtin_cpu_supports("avx2") &&
         __builtin_cpu_supports("fma") && __builtin_cpu_supports("bmi") &&
         __builtin_cpu_supports("bmi2") && __builtin_cpu_supports("movbe");
#endif
}
#endif

}  // namespace

const ActivationKernels* activation_kernels_for(const char* isa) {
  if (std::strcmp(isa, "baseline") == 0) return &kBaselineActivationKernels;
#if defined(DDP_AVX512_KERNELS)
  static const bool avx512 = cpu_has_avx512();
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
