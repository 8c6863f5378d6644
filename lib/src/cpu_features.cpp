#include "cpu_features.h"

#include <cstring>

#if defined(__aarch64__)
#include <asm/hwcap.h>
#include <sys/auxv.h>
#endif

#include "ddp/error.h"
#include "ddp/settings.h"

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

const char* const kKernelIsas[3] = {"baseline", "avx2", "avx512"};

namespace {

int isa_rank(const char* isa) {
  for (int i = 0; i < 3; ++i) {
    if (std::strcmp(isa, kKernelIsas[i]) == 0) return i;
  }
  return -1;
}

}  // namespace

bool isa_allowed(const char* isa, const char* cap) {
  return cap == nullptr || isa_rank(isa) <= isa_rank(cap);
}

void check_isa_cap(const char* cap) {
  const int rank = isa_rank(cap);
  if (rank < 0) {
    throw ConfigError(std::string("DDP_ISA='") + cap +
                      "' is not known; use baseline, avx2 or avx512, or unset it");
  }
  const bool runs =
      rank == 0 || (rank == 1 && cpu_runs_x86_64_v3()) || (rank == 2 && cpu_runs_x86_64_v4());
  if (!runs) {
    throw ConfigError(std::string("DDP_ISA=") + cap + ": this " +
                      (rank == 1 ? "CPU does not run x86-64-v3 (AVX2, FMA, BMI2, F16C)"
                                 : "CPU does not run x86-64-v4 (AVX-512 F/BW/CD/DQ/VL)") +
                      " or this is not an x86-64 build; use a narrower set (baseline runs "
                      "everywhere), or unset it to take the widest this CPU runs");
  }
}

std::optional<std::string> isa_cap() {
  settings::refuse_replaced();  // DDP_REDUCE_ISA and DDP_KERNEL_ISA
  auto cap = settings::spelling(settings::kIsa);
  if (cap) check_isa_cap(cap->c_str());
  return cap;
}

}  // namespace ddp::detail
