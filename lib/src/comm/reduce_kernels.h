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

}  // namespace ddp::detail
