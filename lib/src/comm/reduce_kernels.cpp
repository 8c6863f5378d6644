#include "comm/reduce_kernels.h"

#include <algorithm>
#include <cstdint>

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
void reduce_span(T* out, const T* a, const T* b, std::size_t n) {
  const auto count = static_cast<Eigen::Index>(n);
  ConstArray<T> x(a, count);
  ConstArray<T> y(b, count);
  Array<T> z(out, count);
  if constexpr (Op == ReduceOp::kMin) {
    z = x.min(y);
  } else if constexpr (Op == ReduceOp::kMax) {
    z = x.max(y);
  } else {
    z = x + y;
  }
}

// Asks for write ownership of [data, data + bytes) ahead of the stores: PREFETCHW on x86 (a no-op
// on CPUs that predate it; written as asm, since GCC drops a function of bare prefetches as having
// no effect), PRFM PSTL1KEEP elsewhere.
void prefetch_for_write(const char* data, std::size_t bytes) {
  constexpr std::size_t kCacheLine = 64;
  for (std::size_t offset = 0; offset < bytes; offset += kCacheLine) {
#if defined(__x86_64__) || defined(__i386__)
    asm volatile("prefetchw %0" : : "m"(data[offset]));
#else
    __builtin_prefetch(data + offset, /*rw=*/1, /*locality=*/3);
#endif
  }
}

// A collective reduces into memory its peers have just read: on shm a peer's cross-memory-attach
// copy leaves the lines in its cache, and plain stores to such lines stall on taking them back,
// only a few round trips in flight at a time. PREFETCHW one block ahead puts many more in flight.
// bench/reduce_kernel_bench, 512 KiB of floats: 29-30 us against 48-50 with plain stores when
// another core had just read the output, 15-17 against 11-13 when none had. A 1 MiB allreduce on
// shm takes 0.86-0.91 of its time; tcp and gloo are level within noise
// (bench/results/2026-11-23-reduce-prefetchw.txt).
template <typename T, ReduceOp Op>
void reduce_native(void* out, const void* a, const void* b, std::size_t n) {
  constexpr std::size_t kBlock = 4096 / sizeof(T);
  T* z = static_cast<T*>(out);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  for (std::size_t start = 0; start < n; start += kBlock) {
    const std::size_t len = std::min(kBlock, n - start);
    const std::size_t next = start + len;
    if (next < n) {
      prefetch_for_write(reinterpret_cast<const char*>(z + next),
                         std::min(kBlock, n - next) * sizeof(T));
    }
    reduce_span<T, Op>(z + start, x + start, y + start, len);
  }
}

// Half types: widen a block to float, reduce there, round back (keeps the loop vectorisable).
template <typename Half, ReduceOp Op>
void reduce_half(void* out, const void* a, const void* b, std::size_t n) {
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
    reduce_span<float, Op>(fz, fx, fy, len);
    for (std::size_t i = 0; i < len; ++i) z[start + i] = Half(fz[i]);
  }
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

}  // namespace ddp::detail
