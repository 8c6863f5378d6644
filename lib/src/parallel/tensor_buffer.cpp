// Buffer's view of a torch tensor. It lives in ddp::parallel, the first part of the library that
// links libtorch: ddp::comm stays torch-free, so that bindings for another torch than the one
// this library was built with (python/ddprun_torch) can load it.
#include <ATen/core/Tensor.h>

#include <string>

#include "ddp/comm/types.h"
#include "ddp/error.h"

namespace ddp {

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
