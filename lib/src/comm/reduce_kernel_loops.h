#pragma once
// The element-wise reduction loops, included by exactly one translation unit per instruction set
// (reduce_kernels_<isa>.cpp), which compiles them with its own target flags. Plain loops that
// GCC vectorises, everything in an anonymous namespace: Eigen's assignment loops are inline
// functions with external linkage that GCC emits out of line even at -O2 (min/max), and the copy
// the linker keeps for the library could be the AVX-512 one, which would fault on a CPU without
// it. A test checks that the wider objects define nothing but their tables.
//
// Every variant computes the same bits: each element is one IEEE operation (no contraction,
// -ffp-contract=off), min/max are std::min/std::max (the second operand only when it is
// strictly smaller/larger, which fixes what NaN and signed zeros give), bfloat16 goes through
// float with c10's rounding. float16 stays with the baseline kernels in every table
// (reduce_kernels_float16.cpp): its conversions are c10's, and CPU training does not use it.
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "base/bfloat16_bits.h"
#include "comm/reduce_kernels.h"

namespace ddp::detail {
namespace {

template <typename T>
inline T sum_of(T a, T b) {
  return a + b;
}
template <typename T>
inline T min_of(T a, T b) {
  return b < a ? b : a;
}
template <typename T>
inline T max_of(T a, T b) {
  return a < b ? b : a;
}

template <typename T, T (*Op)(T, T)>
void reduce_loop(void* out, const void* a, const void* b, std::size_t n) {
  // No __restrict: out may alias a or b, which element-wise loops allow.
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  T* z = static_cast<T*>(out);
  for (std::size_t i = 0; i < n; ++i) z[i] = Op(x[i], y[i]);
}

template <float (*Op)(float, float)>
void reduce_bfloat16_loop(void* out, const void* a, const void* b, std::size_t n) {
  const auto* x = static_cast<const std::uint16_t*>(a);
  const auto* y = static_cast<const std::uint16_t*>(b);
  auto* z = static_cast<std::uint16_t*>(out);
  for (std::size_t i = 0; i < n; ++i) {
    z[i] = float_to_bfloat16_bits(Op(bfloat16_bits_to_float(x[i]), bfloat16_bits_to_float(y[i])));
  }
}

// (a + b) / divisor: the sum rounded to T, then the quotient, as the sum kernel followed by the
// divide kernel would compute them (integers truncate toward zero, like C++). A power-of-two
// divisor multiplies by its reciprocal, which is exact: the same bits for a multiply.
template <typename T>
void sum_divide_loop(void* out, const void* a, const void* b, std::size_t n, int divisor) {
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  T* z = static_cast<T*>(out);
  if constexpr (std::is_floating_point_v<T>) {
    if ((divisor & (divisor - 1)) == 0) {
      const T inverse = T{1} / static_cast<T>(divisor);
      for (std::size_t i = 0; i < n; ++i) z[i] = static_cast<T>(x[i] + y[i]) * inverse;
      return;
    }
  }
  const T d = static_cast<T>(divisor);
  for (std::size_t i = 0; i < n; ++i) z[i] = static_cast<T>(x[i] + y[i]) / d;
}

// The bfloat16 sum rounded, then scaled by 1/divisor and rounded again, as the sum kernel
// followed by the divide kernel would compute it.
void sum_divide_bfloat16_loop(void* out, const void* a, const void* b, std::size_t n, int divisor) {
  const auto* x = static_cast<const std::uint16_t*>(a);
  const auto* y = static_cast<const std::uint16_t*>(b);
  auto* z = static_cast<std::uint16_t*>(out);
  const float inverse = 1.0f / static_cast<float>(divisor);
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint16_t sum =
        float_to_bfloat16_bits(bfloat16_bits_to_float(x[i]) + bfloat16_bits_to_float(y[i]));
    z[i] = float_to_bfloat16_bits(bfloat16_bits_to_float(sum) * inverse);
  }
}

template <typename T>
void divide_loop(void* data, std::size_t n, int divisor) {
  T* z = static_cast<T*>(data);
  const T d = static_cast<T>(divisor);
  for (std::size_t i = 0; i < n; ++i) z[i] = z[i] / d;
}

void divide_bfloat16_loop(void* data, std::size_t n, int divisor) {
  auto* z = static_cast<std::uint16_t*>(data);
  const float inverse = 1.0f / static_cast<float>(divisor);
  for (std::size_t i = 0; i < n; ++i) {
    z[i] = float_to_bfloat16_bits(bfloat16_bits_to_float(z[i]) * inverse);
  }
}

template <typename T>
constexpr ReduceKernels::PerType native_kernels() {
  return {reduce_loop<T, sum_of<T>>, reduce_loop<T, min_of<T>>, reduce_loop<T, max_of<T>>,
          sum_divide_loop<T>, divide_loop<T>};
}

constexpr ReduceKernels make_reduce_kernels(const char* isa) {
  ReduceKernels table{isa, {}};
  table.by_type[static_cast<int>(DataType::kFloat32)] = native_kernels<float>();
  table.by_type[static_cast<int>(DataType::kFloat64)] = native_kernels<double>();
  table.by_type[static_cast<int>(DataType::kInt32)] = native_kernels<std::int32_t>();
  table.by_type[static_cast<int>(DataType::kInt64)] = native_kernels<std::int64_t>();
  table.by_type[static_cast<int>(DataType::kBFloat16)] = {
      reduce_bfloat16_loop<sum_of<float>>, reduce_bfloat16_loop<min_of<float>>,
      reduce_bfloat16_loop<max_of<float>>, sum_divide_bfloat16_loop, divide_bfloat16_loop};
  table.by_type[static_cast<int>(DataType::kFloat16)] = {float16_sum, float16_min, float16_max,
                                                         float16_sum_divide, float16_divide};
  return table;
}

}  // namespace
}  // namespace ddp::detail
