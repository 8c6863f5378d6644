#include "ddp/comm/types.h"

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

}  // namespace ddp
