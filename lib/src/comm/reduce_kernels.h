#pragma once
// Element-wise reduction kernels shared by every backend: out[i] = a[i] (op) b[i], vectorised
// with Eigen. Half types are widened to float, reduced and rounded back.
#include <cstddef>

#include "ddp/comm/types.h"

namespace ddp::detail {

// out may alias a or b.
using ReduceFn = void (*)(void* out, const void* a, const void* b, std::size_t count);

// The kernel for (dtype, op); kAvg uses the sum kernel (the caller divides once at the end).
ReduceFn reduce_kernel(DataType dtype, ReduceOp op);

// data[i] /= divisor, for kAvg after the sum.
void divide_in_place(void* data, std::size_t count, DataType dtype, int divisor);

// out[i] = (a[i] + b[i]) / divisor: the last combination of an average.
using SumDivideFn = void (*)(void* out, const void* a, const void* b, std::size_t count,
                             int divisor);

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

}  // namespace ddp::detail
