#include "ddp/comm/types.h"

#include <ATen/core/Tensor.h>

#include "ddp/error.h"

namespace ddp {

std::size_t element_size(DataType type) {
  switch (type) {
    case DataType::kFloat32:
      return 4;
    case DataType::kFloat64:
      return 8;
    case DataType::kBFloat16:
      return 2;
    case DataType::kFloat16:
      return 2;
    case DataType::kInt32:
      return 4;
    case DataType::kInt64:
      return 8;
  }
  return 0;
}

const char* to_string(DataType type) {
  switch (type) {
    case DataType::kFloat32:
      return "float32";
    case DataType::kFloat64:
      return "float64";
    case DataType::kBFloat16:
      return "bfloat16";
    case DataType::kFloat16:
      return "float16";
    case DataType::kInt32:
      return "int32";
    case DataType::kInt64:
      return "int64";
  }
  return "unknown";
}

const char* to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kAvg:
      return "avg";
    case ReduceOp::kMin:
      return "min";
    case ReduceOp::kMax:
      return "max";
  }
  return "unknown";
}

namespace {

DataType data_type_of_tensor(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat:
      return DataType::kFloat32;
    case at::kDouble:
      return DataType::kFloat64;
    case at::kBFloat16:
      return DataType::kBFloat16;
    case at::kHalf:
      return DataType::kFloat16;
    case at::kInt:
      return DataType::kInt32;
    case at::kLong:
      return DataType::kInt64;
    default:
      throw Error(std::string("tensor dtype ") + c10::toString(t.scalar_type()) +
                  " is not supported by collectives; use float32, float64, bfloat16, float16, "
                  "int32 or int64");
  }
}

}  // namespace

Buffer::Buffer(const at::Tensor& tensor) {
  if (!tensor.defined()) throw Error("collective given an undefined tensor");
  if (!tensor.device().is_cpu()) {
    throw Error("collective given a " + tensor.device().str() +
                " tensor; ddp communicators take CPU tensors");
  }
  if (!tensor.is_contiguous()) {
    throw Error("collective given a non-contiguous tensor; call .contiguous() first");
  }
  data = tensor.data_ptr();
  count = static_cast<std::size_t>(tensor.numel());
  dtype = data_type_of_tensor(tensor);
}

}  // namespace ddp
