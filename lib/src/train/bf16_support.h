#pragma once
// Whether bfloat16 autocast runs: on a CPU without native bfloat16 arithmetic libtorch emulates
// it, and a step took 14 times the float32 one (2.05 against 0.147 s, 2 ranks, MNIST CNN, AMD
// Zen 3). Such a request falls back to float32 with one warning per process, rather than failing:
// on spot capacity the pods of one job may land on CPUs of different generations, and a rank in
// float32 still trains the same model (gradients and weights are float32 either way).
//
// The same holds where this libtorch cannot multiply bfloat16 matrices on this CPU: Debian's
// torch 1.13 hands a bfloat16 matmul of more than 16^3 multiply-adds to oneDNN whenever the CPU
// reports BF16 (Graviton3 does), and Debian's oneDNN 2.6, built without the Arm Compute Library,
// has no arm64 bfloat16 matmul: every such op throws "could not create a primitive descriptor
// iterator" (reproduced under qemu-aarch64 with BF16, at SVE 256 and 512; with oneDNN disabled
// the same op runs, on torch's reference kernels, slower than float32).

namespace ddp::train::detail {

// `requested`, unless the CPU lacks native bfloat16 (cpu_computes_bf16_natively) or this
// libtorch cannot multiply bfloat16 matrices on it (torch_multiplies_bf16), in which case it logs
// the warning (once) and returns false. DDP_TEST_CPU_BF16=0|1 replaces the CPU's answer
// (a test hook).
bool bf16_autocast_enabled(bool requested);

// Whether this libtorch multiplies bfloat16 matrices on this CPU: one addmm large enough to take
// oneDNN's path where torch gives it one, run once per process.
bool torch_multiplies_bf16();

}  // namespace ddp::train::detail
