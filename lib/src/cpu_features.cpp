#include "cpu_features.h"

#if defined(__aarch64__)
#include <asm/hwcap.h>
#include <sys/auxv.h>
#endif

namespace ddp::detail {

#if defined(__x86_64__)
bool cpu_runs_x86_64_v3() {
  __builtin_cpu_init();
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
  return __builtin_cpu_supports("x86-64-v3");
#else
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("avx") &&
         __builtin_cpu_supports("fma") && __builtin_cpu_supports("bmi") &&
         __builtin_cpu_supports("bmi2") && __builtin_cpu_supports("f16c") &&
         __builtin_cpu_supports("movbe");
#endif
}

bool cpu_runs_x86_64_v4() {
  __builtin_cpu_init();
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
  return __builtin_cpu_supports("x86-64-v4");
#else
  return cpu_runs_x86_64_v3() && __builtin_cpu_supports("avx512f") &&
         __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512cd");
#endif
}

bool cpu_computes_bf16_natively() {
  __builtin_cpu_init();
  // Also checks that the kernel saves the AVX-512 state.
  return __builtin_cpu_supports("avx512bf16");
}
const char* native_bf16_feature() { return "avx512_bf16"; }
#else
bool cpu_runs_x86_64_v3() { return false; }
bool cpu_runs_x86_64_v4() { return false; }
#if defined(__aarch64__)
bool cpu_computes_bf16_natively() {
#ifdef HWCAP2_BF16
  return (getauxval(AT_HWCAP2) & HWCAP2_BF16) != 0;
#else
  return false;
#endif
}
const char* native_bf16_feature() { return "bf16"; }
#else
bool cpu_computes_bf16_natively() { return false; }
const char* native_bf16_feature() { return "native bfloat16"; }
#endif
#endif

}  // namespace ddp::detail
