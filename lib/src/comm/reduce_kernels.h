#pragma once
// Element-wise reduction kernels shared by every backend: out[i] = a[i] (op) b[i]. Half types are
// widened to float, reduced and rounded back.
//
// The loops (reduce_kernel_loops.h) are compiled once per instruction set, for the baseline the
// library targets (on arm64 that is NEON), on x86-64 for x86-64-v3 (AVX2) and x86-64-v4
// (AVX-512), and on arm64 for SVE; the widest the CPU runs is chosen on first use. Every variant
// computes the same bits, so ranks on different CPUs still agree.
#include <cstddef>

#include "ddp/comm/types.h"

namespace ddp::detail {

// out may alias a or b.
using ReduceFn = void (*)(void* out, const void* a, const void* b, std::size_t count);
// out[i] = (a[i] + b[i]) / divisor: the last combination of an average.
using SumDivideFn = void (*)(void* out, const void* a, const void* b, std::size_t count,
                             int divisor);
// data[i] /= divisor.
using DivideFn = void (*)(void* data, std::size_t count, int divisor);

// One instruction set's kernels. A plain aggregate: no member function that a wider unit could
// emit a shared copy of.
struct ReduceKernels {
  struct PerType {
    ReduceFn sum, min, max;
    SumDivideFn sum_divide;
    DivideFn divide;
  };
  static constexpr int kTypes = 6;  // DataType's enumerators, by value

  const char* isa;  // "baseline", "avx2", "avx512" or "sve"
  PerType by_type[kTypes];
};

// The variant named `isa` if this build and this CPU have it, else null.
const ReduceKernels* reduce_kernels_for(const char* isa);
// The widest variant this build and CPU run that is no wider than `cap` (null: no cap). A cap
// that is unknown or that the CPU cannot run is a ConfigError naming DDP_ISA.
const ReduceKernels& select_reduce_kernels(const char* cap);
// The variant in use, chosen on first use under DDP_ISA's cap.
const ReduceKernels& reduce_kernels();

// The kernel for (dtype, op); kAvg uses the sum kernel (the caller divides once at the end).
ReduceFn reduce_kernel(DataType dtype, ReduceOp op);

// data[i] /= divisor, for kAvg after the sum.
void divide_in_place(void* data, std::size_t count, DataType dtype, int divisor);

// How a collective combines the ranks' payloads: combine() for every combination but the one
// that completes a result, complete() for that one. For kAvg complete() also divides by the
// number of ranks in the same pass, rounding exactly as the sum followed by divide_in_place
// would, so the result is not read and written a second time (DDP averages every bucket).
class Reduction {
 public:
  Reduction(DataType dtype, ReduceOp op, int ranks);
  void combine(void* out, const void* a, const void* b, std::size_t count) const {
    combine_(out, a, b, count);
  }
  void complete(void* out, const void* a, const void* b, std::size_t count) const;

 private:
  ReduceFn combine_;
  SumDivideFn sum_divide_;  // kAvg only
  int ranks_;
};

// float16's kernels, the same in every variant: compiled once, with c10's conversions
// (reduce_kernels_float16.cpp).
void float16_sum(void* out, const void* a, const void* b, std::size_t count);
void float16_min(void* out, const void* a, const void* b, std::size_t count);
void float16_max(void* out, const void* a, const void* b, std::size_t count);
void float16_sum_divide(void* out, const void* a, const void* b, std::size_t count, int divisor);
void float16_divide(void* data, std::size_t count, int divisor);

}  // namespace ddp::detail
