#pragma once
// Which x86-64 microarchitecture levels this CPU runs, for the kernels compiled once per level
// (activation and reduction kernels). False everywhere on other architectures.
namespace ddp::detail {

// Everything -march=x86-64-v3 lets the compiler use (AVX2, FMA, BMI1/2, F16C, MOVBE, ...).
bool cpu_runs_x86_64_v3();
// Everything -march=x86-64-v4 lets the compiler use: v3 and AVX-512 F/BW/CD/DQ/VL.
bool cpu_runs_x86_64_v4();

}  // namespace ddp::detail
