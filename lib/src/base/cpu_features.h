#pragma once
// Which instruction sets this CPU runs, for the kernels compiled once per set (activation and
// reduction kernels): x86-64 microarchitecture levels, arm64's SVE. Each is false on the other
// architecture.
#include <optional>
#include <string>

namespace ddp::detail {

// Everything -march=x86-64-v3 lets the compiler use (AVX2, FMA, BMI1/2, F16C, MOVBE, ...).
bool cpu_runs_x86_64_v3();
// Everything -march=x86-64-v4 lets the compiler use: v3 and AVX-512 F/BW/CD/DQ/VL.
bool cpu_runs_x86_64_v4();
// The Scalable Vector Extension (arm64: Graviton3 and Graviton4, Neoverse V1/V2/N2; not
// Graviton2's Neoverse N1), from the kernel's hwcaps.
bool cpu_runs_sve();

// Whether the CPU computes in bfloat16 natively: AVX512_BF16 on x86-64 (Cooper Lake, Sapphire
// Rapids, Zen 4 and later; AMX-BF16 CPUs have it too), the BF16 extension on arm64 (Graviton3,
// Neoverse V1/N2 and later). Elsewhere libtorch emulates bfloat16 arithmetic.
bool cpu_computes_bf16_natively();
// The feature cpu_computes_bf16_natively() looks for, for messages: "avx512_bf16" or "bf16".
const char* native_bf16_feature();

// The instruction sets kernels are compiled for on this architecture, narrowest first. x86-64:
// "baseline" (SSE2), "avx2" (x86-64-v3) and "avx512" (x86-64-v4). arm64: "baseline" (armv8-a,
// whose Advanced SIMD makes it the NEON path) and "sve" (armv8.2-a+sve). A kernel family offers
// some of them and takes the widest one that is allowed (isa_allowed) and that the CPU runs.
int kernel_isa_count();
const char* kernel_isa(int i);  // 0 <= i < kernel_isa_count()
// Whether this CPU runs `isa`, one of kKernelIsas (false for any other name).
bool cpu_runs_isa(const char* isa);
// Whether `isa` is no wider than `cap` (null: no cap).
bool isa_allowed(const char* isa, const char* cap);
// ConfigError naming DDP_ISA unless `cap` is an instruction set this build and CPU run.
void check_isa_cap(const char* cap);
// DDP_ISA, checked: the widest instruction set kernels may use; nullopt when unset.
std::optional<std::string> isa_cap();

}  // namespace ddp::detail
