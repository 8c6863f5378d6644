#pragma once
// Reads and writes buffer elements of any ddp::DataType as double, for tests that check exact
// integer-valued results across every element type.
#include <cstddef>
#include <cstdint>
#include <vector>

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include "ddp/comm/types.h"

namespace ddp::detail::collectives::testing {

inline void set_value(void* data, DataType dtype, std::size_t i, double v) {
  switch (dtype) {
    case DataType::kFloat32:
      static_cast<float*>(data)[i] = static_cast<float>(v);
      break;
    case DataType::kFloat64:
      static_cast<double*>(data)[i] = v;
      break;
    case DataType::kInt32:
      static_cast<std::int32_t*>(data)[i] = static_cast<std::int32_t>(v);
      break;
    case DataType::kInt64:
      static_cast<std::int64_t*>(data)[i] = static_cast<std::int64_t>(v);
      break;
    case DataType::kBFloat16:
      static_cast<c10::BFloat16*>(data)[i] = c10::BFloat16(static_cast<float>(v));
      break;
    case DataType::kFloat16:
      static_cast<c10::Half*>(data)[i] = c10::Half(static_cast<float>(v));
      break;
  }
}

inline double get_value(const void* data, DataType dtype, std::size_t i) {
  switch (dtype) {
    case DataType::kFloat32:
      return static_cast<const float*>(data)[i];
    case DataType::kFloat64:
      return static_cast<const double*>(data)[i];
    case DataType::kInt32:
      return static_cast<const std::int32_t*>(data)[i];
    case DataType::kInt64:
      return static_cast<double>(static_cast<const std::int64_t*>(data)[i]);
    case DataType::kBFloat16:
      return static_cast<float>(static_cast<const c10::BFloat16*>(data)[i]);
    case DataType::kFloat16:
      return static_cast<float>(static_cast<const c10::Half*>(data)[i]);
  }
  return 0;
}

// Storage for `count` elements of `dtype`, viewed as a Buffer.
struct TypedBuffer {
  TypedBuffer(std::size_t count, DataType dtype)
      : bytes(count * element_size(dtype) + 1), count(count), dtype(dtype) {}
  Buffer view() { return {bytes.data(), count, dtype}; }
  void set(std::size_t i, double v) { set_value(bytes.data(), dtype, i, v); }
  double get(std::size_t i) const { return get_value(bytes.data(), dtype, i); }

  std::vector<char> bytes;  // one spare byte so that even an empty buffer has an address
  std::size_t count;
  DataType dtype;
};

// Element i of rank r: small integers, so every dtype (bf16 included) holds sums exactly.
inline double value(int r, std::size_t i) { return (r + 1) * static_cast<double>(i % 7 + 1); }

// What `op` over n ranks' value(r, i) gives, in `dtype` (kAvg truncates integers).
inline double expected(ReduceOp op, int n, std::size_t i, DataType dtype) {
  const double unit = static_cast<double>(i % 7 + 1);
  switch (op) {
    case ReduceOp::kSum:
      return unit * n * (n + 1) / 2;
    case ReduceOp::kMin:
      return unit;
    case ReduceOp::kMax:
      return unit * n;
    case ReduceOp::kAvg: {
      const double sum = unit * n * (n + 1) / 2;
      const bool integral = dtype == DataType::kInt32 || dtype == DataType::kInt64;
      return integral ? static_cast<double>(static_cast<std::int64_t>(sum) / n) : sum / n;
    }
  }
  return 0;
}

inline const std::vector<DataType>& all_dtypes() {
  static const std::vector<DataType> types{DataType::kFloat32,  DataType::kFloat64,
                                           DataType::kBFloat16, DataType::kFloat16,
                                           DataType::kInt32,    DataType::kInt64};
  return types;
}

}  // namespace ddp::detail::collectives::testing
