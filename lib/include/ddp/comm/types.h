#pragma once
// Element types, reduction ops and the non-owning buffer view that collectives operate on.
#include <cstddef>
#include <cstdint>
#include <vector>

namespace at {
class Tensor;
}

namespace ddp {

enum class DataType { kFloat32, kFloat64, kBFloat16, kFloat16, kInt32, kInt64 };
enum class ReduceOp { kSum, kAvg, kMin, kMax };

std::size_t element_size(DataType type);
const char* to_string(DataType type);
const char* to_string(ReduceOp op);

// Half-precision element types, stored as raw bits (the backends convert when reducing).
struct BFloat16Bits {
  std::uint16_t bits;
};
struct Float16Bits {
  std::uint16_t bits;
};

template <typename T>
constexpr DataType data_type_of();
template <>
constexpr DataType data_type_of<float>() {
  return DataType::kFloat32;
}
template <>
constexpr DataType data_type_of<double>() {
  return DataType::kFloat64;
}
template <>
constexpr DataType data_type_of<BFloat16Bits>() {
  return DataType::kBFloat16;
}
template <>
constexpr DataType data_type_of<Float16Bits>() {
  return DataType::kFloat16;
}
template <>
constexpr DataType data_type_of<std::int32_t>() {
  return DataType::kInt32;
}
template <>
constexpr DataType data_type_of<std::int64_t>() {
  return DataType::kInt64;
}

// A view of `count` contiguous elements of host memory. Collectives read and write through it;
// the caller keeps the memory alive until the operation completes.
struct Buffer {
  void* data = nullptr;
  std::size_t count = 0;
  DataType dtype = DataType::kFloat32;

  Buffer() = default;
  Buffer(void* d, std::size_t n, DataType t) : data(d), count(n), dtype(t) {}
  template <typename T>
  Buffer(T* d, std::size_t n) : data(d), count(n), dtype(data_type_of<T>()) {}
  template <typename T>
  Buffer(std::vector<T>& v) : Buffer(v.data(), v.size()) {}  // NOLINT: implicit by design
  // A contiguous CPU tensor of a supported dtype; throws ddp::Error otherwise. Defined in
  // ddp::parallel (link it, or ddp::ddp, to pass tensors): ddp::comm itself does not link torch.
  Buffer(const at::Tensor& tensor);  // NOLINT: implicit by design

  std::size_t bytes() const { return count * element_size(dtype); }
  Buffer slice(std::size_t offset, std::size_t n) const {
    return {static_cast<char*>(data) + offset * element_size(dtype), n, dtype};
  }
};

}  // namespace ddp
