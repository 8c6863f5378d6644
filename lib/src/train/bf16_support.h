#pragma once
// Whether bfloat16 autocast runs: on a CPU without native bfloat16 arithmetic libtorch emulates
// it, and a step took 14 times the float32 one (2.05 against 0.147 s, 2 ranks, MNIST CNN, AMD
// Zen 3). Such a request falls back to float32 with one warning per process, rather than failing:
// on spot capacity the pods of one job may land on CPUs of different generations, and a rank in
// float32 still trains the same model (gradients and weights are float32 either way).

namespace ddp::train::detail {

// `requested`, unless the CPU lacks native bfloat16 (cpu_computes_bf16_natively), in which case
// it logs the warning (once) and returns false. DDP_TEST_CPU_BF16=0|1 replaces the CPU's answer
// (a test hook).
bool bf16_autocast_enabled(bool requested);

}  // namespace ddp::train::detail
