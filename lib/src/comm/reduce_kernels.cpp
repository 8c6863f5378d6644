#include "comm/reduce_kernels.h"

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <Eigen/Core>

namespace ddp::detail {
namespace {

template <typename T>
using ConstArray = Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, 1>>;
template <typename T>
using Array = Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>>;

template <typename T, ReduceOp Op>
void reduce_native(void* out, const void* a, const void* b, std::size_t n) {
  const auto count = static_cast<Eigen::Index>(n);
  ConstArray<T> x(static_cast<const T*>(a), count);
  ConstArray<T> y(static_cast<const T*>(b), count);
  Array<T> z(static_cast<T*>(out), count);
  if constexpr (Op == ReduceOp::kMin) {
    z = x.min(y);
  } else if constexpr (Op == ReduceOp::kMax) {
    z = x.max(y);
  } else {
    z = x + y;
  }
}

// (a + b) / divisor: the sum rounded to T, then the quotient, as reduce_native followed by
// divide_native would compute them (integers truncate toward zero, like C++).
template <typename T>
void sum_divide_native(void* out, const void* a, const void* b, std::size_t n, int divisor) {
  const auto count = static_cast<Eigen::Index>(n);
  ConstArray<T> x(static_cast<const T*>(a), count);
  ConstArray<T> y(static_cast<const T*>(b), count);
  Array<T> z(static_cast<T*>(out), count);
  if constexpr (std::is_floating_point_v<T>) {
    if ((divisor & (divisor - 1)) == 0) {
      // The reciprocal of a power of two is exact, so the product rounds the same real number
      // as the quotient: the same bits, for a multiply instead of a divide.
      z = (x + y) * (T{1} / static_cast<T>(divisor));
      return;
    }
  }
  z = (x + y) / static_cast<T>(divisor);
}

// Half types: widen a block to float, reduce there, and let `round` store each result (keeps the
// loop vectorisable).
template <typename Half, ReduceOp Op, typename Round>
void reduce_half_blocks(void* out, const void* a, const void* b, std::size_t n, Round&& round) {
  constexpr std::size_t kBlock = 256;
  const Half* x = static_cast<const Half*>(a);
  const Half* y = static_cast<const Half*>(b);
  Half* z = static_cast<Half*>(out);
  float fx[kBlock], fy[kBlock], fz[kBlock];
  for (std::size_t start = 0; start < n; start += kBlock) {
    const std::size_t len = std::min(kBlock, n - start);
    for (std::size_t i = 0; i < len; ++i) {
      fx[i] = static_cast<float>(x[start + i]);
      fy[i] = static_cast<float>(y[start + i]);
    }
    reduce_native<float, Op>(fz, fx, fy, len);
    for (std::size_t i = 0; i < len; ++i) z[start + i] = round(fz[i]);
  }
}

template <typename Half, ReduceOp Op>
void reduce_half(void* out, const void* a, const void* b, std::size_t n) {
  reduce_half_blocks<Half, Op>(out, a, b, n, [](float v) { return Half(v); });
}

// The sum rounded to Half, then scaled as divide_half scales it.
template <typename Half>
void sum_divide_half(void* out, const void* a, const void* b, std::size_t n, int divisor) {
  const float inv = 1.0f / static_cast<float>(divisor);
  reduce_half_blocks<Half, ReduceOp::kSum>(
      out, a, b, n, [inv](float v) { return Half(static_cast<float>(Half(v)) * inv); });
}

SumDivideFn sum_divide_kernel(DataType dtype) {
  switch (dtype) {
    case DataType::kFloat32:
      return sum_divide_native<float>;
    case DataType::kFloat64:
      return sum_divide_native<double>;
    case DataType::kInt32:
      return sum_divide_native<std::int32_t>;
    case DataType::kInt64:
      return sum_divide_native<std::int64_t>;
    case DataType::kBFloat16:
      return sum_divide_half<c10::BFloat16>;
    case DataType::kFloat16:
      return sum_divide_half<c10::Half>;
  }
  return nullptr;
}

template <ReduceOp Op>
ReduceFn kernel_for(DataType dtype) {
  switch (dtype) {
    case DataType::kFloat32:
      return reduce_native<float, Op>;
    case DataType::kFloat64:
      return reduce_native<double, Op>;
    case DataType::kInt32:
      return reduce_native<std::int32_t, Op>;
    case DataType::kInt64:
      return reduce_native<std::int64_t, Op>;
    case DataType::kBFloat16:
      return reduce_half<c10::BFloat16, Op>;
    case DataType::kFloat16:
      return reduce_half<c10::Half, Op>;
  }
  return nullptr;
}

template <typename T>
void divide_native(void* data, std::size_t n, int divisor) {
  Array<T> z(static_cast<T*>(data), static_cast<Eigen::Index>(n));
  z /= static_cast<T>(divisor);
}

template <typename Half>
void divide_half(void* data, std::size_t n, int divisor) {
  Half* z = static_cast<Half*>(data);
  const float inv = 1.0f / static_cast<float>(divisor);
  for (std::size_t i = 0; i < n; ++i) z[i] = Half(static_cast<float>(z[i]) * inv);
}

}  // namespace

ReduceFn reduce_kernel(DataType dtype, ReduceOp op) {
  switch (op) {
    case ReduceOp::kMin:
      return kernel_for<ReduceOp::kMin>(dtype);
    case ReduceOp::kMax:
      return kernel_for<ReduceOp::kMax>(dtype);
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return kernel_for<ReduceOp::kSum>(dtype);
  }
  return nullptr;
}

void divide_in_place(void* data, std::size_t count, DataType dtype, int divisor) {
  switch (dtype) {
    case DataType::kFloat32:
      return divide_native<float>(data, count, divisor);
    case DataType::kFloat64:
      return divide_native<double>(data, count, divisor);
    case DataType::kInt32:
      return divide_native<std::int32_t>(data, count, divisor);
    case DataType::kInt64:
      return divide_native<std::int64_t>(data, count, divisor);
    case DataType::kBFloat16:
      return divide_half<c10::BFloat16>(data, count, divisor);
    case DataType::kFloat16:
      return divide_half<c10::Half>(data, count, divisor);
  }
}

Reduction::Reduction(DataType dtype, ReduceOp op, int ranks)
    : combine_(reduce_kernel(dtype, op)),
      sum_divide_(op == ReduceOp::kAvg ? sum_divide_kernel(dtype) : nullptr),
      ranks_(ranks) {}

void Reduction::complete(void* out, const void* a, const void* b, std::size_t count) const {
  if (sum_divide_) return sum_divide_(out, a, b, count, ranks_);
  combine_(out, a, b, count);
}

}  // namespace ddp::detail
