// Unit test of lib/src/parallel/tensor_buffer.cpp: a Buffer made from a tensor (ddp_parallel's
// constructor; ddp::comm itself does not link torch).
#include <gtest/gtest.h>

#include "ddp/comm/types.h"
#include "ddp/error.h"

#include <ATen/ATen.h>

namespace ddp {
namespace {

TEST(Buffer, FromTensorChecksLayoutAndType) {
  auto t = at::arange(6, at::kFloat);
  Buffer b(t);
  EXPECT_EQ(b.count, 6u);
  EXPECT_EQ(b.dtype, DataType::kFloat32);
  EXPECT_EQ(b.data, t.data_ptr());
  EXPECT_EQ(Buffer(at::zeros({2}, at::kBFloat16)).dtype, DataType::kBFloat16);
  EXPECT_THROW(Buffer(at::zeros({4, 4}).t()), Error);              // non-contiguous
  EXPECT_THROW(Buffer(at::zeros({4}, at::kComplexFloat)), Error);  // unsupported dtype
  EXPECT_THROW(Buffer(at::Tensor()), Error);
}

}  // namespace
}  // namespace ddp
