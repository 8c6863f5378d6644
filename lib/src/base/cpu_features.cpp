#include "base/cpu_features.h"

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
bool cpu_runs_sve() { return false; }
#else
bool cpu_runs_x86_64_v3() { return false; }
bool cpu_runs_x86_64_v4() { return false; }
#if defined(__aarch64__)
bool cpu_runs_sve() { return (getauxval(AT_HWCAP) & HWCAP_SVE) != 0; }
bool cpu_computes_bf16_natively() {
#ifdef HWCAP2_BF16
  return (getauxval(AT_HWCAP2) & HWCAP2_BF16) != 0;
#else
  return false;
#endif
}
const char* native_bf16_feature() { return "bf16"; }
#else
bool cpu_runs_sve() { return false; }
bool cpu_computes_bf16_natively() { return false; }
const char* native_bf16_feature() { return "native bfloat16"; }
#endif
#endif

namespace {

bool runs_baseline() { return true; }

// Each instruction set with the CPU level it needs (for messages) and the check that this CPU
// runs it.
struct KernelIsa {
  const char* name;
  const char* needs;
  bool (*runs)();
};
#if defined(__x86_64__)
constexpr KernelIsa kIsas[] = {{"baseline", "x86-64", runs_baseline},
                               {"avx2", "x86-64-v3 (AVX2, FMA, BMI2, F16C)", cpu_runs_x86_64_v3},
                               {"avx512", "x86-64-v4 (AVX-512 F/BW/CD/DQ/VL)", cpu_runs_x86_64_v4}};
#elif defined(__aarch64__)
constexpr KernelIsa kIsas[] = {{"baseline", "armv8-a (NEON)", runs_baseline},
                               {"sve", "SVE (Graviton3 and later; not Graviton2)", cpu_runs_sve}};
#else
constexpr KernelIsa kIsas[] = {{"baseline", "the build's target", runs_baseline}};
#endif
constexpr int kIsaCount = static_cast<int>(sizeof(kIsas) / sizeof(kIsas[0]));

int isa_rank(const char* isa) {
  for (int i = 0; i < kIsaCount; ++i) {
    if (std::strcmp(isa, kIsas[i].name) == 0) return i;
  }
  return -1;
}

std::string known_isas() {
  std::string list;
  for (int i = 0; i < kIsaCount; ++i) {
    list += i == 0 ? "" : i + 1 == kIsaCount ? " or " : ", ";
    list += kIsas[i].name;
  }
  return list;
}

}  // namespace

int kernel_isa_count() { return kIsaCount; }
const char* kernel_isa(int i) { return kIsas[i].name; }

bool cpu_runs_isa(const char* isa) {
  const int rank = isa_rank(isa);
  return rank >= 0 && kIsas[rank].runs();
}

bool isa_allowed(const char* isa, const char* cap) {
  return cap == nullptr || isa_rank(isa) <= isa_rank(cap);
}

void check_isa_cap(const char* cap) {
  const int rank = isa_rank(cap);
  if (rank < 0) {
    throw ConfigError(std::string("DDP_ISA='") + cap + "' is not known on this architecture; use " +
                      known_isas() + ", or unset it");
  }
  if (!cpu_runs_isa(cap)) {
    throw ConfigError(std::string("DDP_ISA=") + cap + ": this CPU does not run " +
                      kIsas[rank].needs +
                      "; use a narrower set (baseline runs everywhere), or unset it to take the "
                      "widest this CPU runs");
  }
}

std::optional<std::string> isa_cap() {
  settings::refuse_replaced();  // DDP_REDUCE_ISA and DDP_KERNEL_ISA
  auto cap = settings::spelling(settings::kIsa);
  if (cap) check_isa_cap(cap->c_str());
  return cap;
}

}  // namespace ddp::detail
