#include "comm/reduce_kernels.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "comm/collective_signature.h"

namespace ddp::detail {
namespace {

template <typename T>
std::vector<T> apply(DataType t, ReduceOp op, std::vector<T> a, const std::vector<T>& b) {
  reduce_kernel(t, op)(a.data(), a.data(), b.data(), a.size());
  return a;
}

TEST(ReduceKernels, NativeTypesSumMinMax) {
  // 1027 elements: exercises the vectorised body and the scalar tail.
  std::vector<float> a(1027), b(1027);
  for (int i = 0; i < 1027; ++i) {
    a[i] = static_cast<float>(i);
    b[i] = static_cast<float>(1027 - i);
  }
  auto sum = apply(DataType::kFloat32, ReduceOp::kSum, a, b);
  auto mn = apply(DataType::kFloat32, ReduceOp::kMin, a, b);
  auto mx = apply(DataType::kFloat32, ReduceOp::kMax, a, b);
  for (int i = 0; i < 1027; ++i) {
    EXPECT_EQ(sum[i], 1027.0f);
    EXPECT_EQ(mn[i], std::min(a[i], b[i]));
    EXPECT_EQ(mx[i], std::max(a[i], b[i]));
  }
  auto i64 = apply<std::int64_t>(DataType::kInt64, ReduceOp::kSum, {1LL << 40, -5}, {1, 7});
  EXPECT_EQ(i64, (std::vector<std::int64_t>{(1LL << 40) + 1, 2}));
}

// Lengths around the vector widths and unrolled loops (and past 4 KiB), and output aliasing
// either input.
template <typename T>
void expect_sums_exact(DataType dtype) {
  const std::size_t block = 4096 / sizeof(T);
  for (std::size_t n :
       {std::size_t{0}, std::size_t{1}, block - 1, block, block + 1, 3 * block + 7}) {
    std::vector<T> a(n), b(n);
    for (std::size_t i = 0; i < n; ++i) {
      a[i] = static_cast<T>(i % 1000);
      b[i] = static_cast<T>(3 * (i % 777));
    }
    std::vector<T> into_a = a, into_b = b, apart(n);
    reduce_kernel(dtype, ReduceOp::kSum)(into_a.data(), into_a.data(), b.data(), n);
    reduce_kernel(dtype, ReduceOp::kSum)(into_b.data(), a.data(), into_b.data(), n);
    reduce_kernel(dtype, ReduceOp::kMax)(apart.data(), a.data(), b.data(), n);
    for (std::size_t i = 0; i < n; ++i) {
      ASSERT_EQ(into_a[i], a[i] + b[i]) << "n=" << n << " i=" << i;
      ASSERT_EQ(into_b[i], a[i] + b[i]) << "n=" << n << " i=" << i;
      ASSERT_EQ(apart[i], std::max(a[i], b[i])) << "n=" << n << " i=" << i;
    }
  }
}

TEST(ReduceKernels, EveryElementOfAnyLengthAndAliasing) {
  expect_sums_exact<float>(DataType::kFloat32);
  expect_sums_exact<double>(DataType::kFloat64);
  expect_sums_exact<std::int32_t>(DataType::kInt32);
  expect_sums_exact<std::int64_t>(DataType::kInt64);
}

TEST(ReduceKernels, HalfTypesRoundTripThroughFloat) {
  std::vector<c10::BFloat16> a(600, c10::BFloat16(1.5f)), b(600, c10::BFloat16(2.0f));
  auto sum = apply(DataType::kBFloat16, ReduceOp::kSum, a, b);
  for (auto v : sum) EXPECT_EQ(static_cast<float>(v), 3.5f);
  std::vector<c10::Half> h(3, c10::Half(-1.0f)), g(3, c10::Half(4.0f));
  auto mx = apply(DataType::kFloat16, ReduceOp::kMax, h, g);
  for (auto v : mx) EXPECT_EQ(static_cast<float>(v), 4.0f);
}

TEST(ReduceKernels, AverageUsesTheSumKernelThenDivides) {
  std::vector<double> a{2, 4}, b{4, 8};
  auto sum = apply(DataType::kFloat64, ReduceOp::kAvg, a, b);
  divide_in_place(sum.data(), sum.size(), DataType::kFloat64, 2);
  EXPECT_EQ(sum, (std::vector<double>{3, 6}));
  std::vector<std::int32_t> ints{7, -7};
  divide_in_place(ints.data(), ints.size(), DataType::kInt32, 2);
  EXPECT_EQ(ints, (std::vector<std::int32_t>{3, -3}));  // truncates toward zero, like C++
}

// complete() of an average must give the very bits of the sum followed by divide_in_place,
// which every rank computed before the two were fused: for every dtype, powers of two (scaled by
// their reciprocal) and others (whose quotients round), negative integers (which truncate) and
// several lengths.
template <typename T>
void expect_fused_average_matches_two_passes(DataType dtype) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> uniform(-1000.0f, 1000.0f);
  for (int ranks : {2, 3, 4, 5, 6, 7, 8, 64}) {
    for (std::size_t n : {std::size_t{1}, std::size_t{255}, std::size_t{257}, std::size_t{5000}}) {
      std::vector<T> a(n), b(n);
      for (std::size_t i = 0; i < n; ++i) {
        a[i] = static_cast<T>(uniform(rng));
        b[i] = static_cast<T>(uniform(rng));
      }
      std::vector<T> two_passes = a;
      reduce_kernel(dtype, ReduceOp::kAvg)(two_passes.data(), two_passes.data(), b.data(), n);
      divide_in_place(two_passes.data(), n, dtype, ranks);
      std::vector<T> fused = a;
      Reduction(dtype, ReduceOp::kAvg, ranks).complete(fused.data(), fused.data(), b.data(), n);
      ASSERT_EQ(std::memcmp(fused.data(), two_passes.data(), n * sizeof(T)), 0)
          << to_string(dtype) << " ranks " << ranks << " n " << n;
      std::vector<T> combined = a;
      Reduction(dtype, ReduceOp::kAvg, ranks)
          .combine(combined.data(), combined.data(), b.data(), n);
      reduce_kernel(dtype, ReduceOp::kSum)(a.data(), a.data(), b.data(), n);
      ASSERT_EQ(std::memcmp(combined.data(), a.data(), n * sizeof(T)), 0)
          << "combine() does not divide";
    }
  }
}

TEST(ReduceKernels, FusedAverageIsBitIdenticalToSumThenDivide) {
  expect_fused_average_matches_two_passes<float>(DataType::kFloat32);
  expect_fused_average_matches_two_passes<double>(DataType::kFloat64);
  expect_fused_average_matches_two_passes<std::int32_t>(DataType::kInt32);
  expect_fused_average_matches_two_passes<std::int64_t>(DataType::kInt64);
  expect_fused_average_matches_two_passes<c10::BFloat16>(DataType::kBFloat16);
  expect_fused_average_matches_two_passes<c10::Half>(DataType::kFloat16);
}

TEST(ReduceKernels, CompleteWithoutAverageIsTheReduction) {
  std::vector<float> a{1, 5, -2}, b{4, 2, -3};
  Reduction(DataType::kFloat32, ReduceOp::kMax, 3).complete(a.data(), a.data(), b.data(), 3);
  EXPECT_EQ(a, (std::vector<float>{4, 5, -2}));
  Reduction(DataType::kFloat32, ReduceOp::kSum, 3).complete(a.data(), a.data(), b.data(), 3);
  EXPECT_EQ(a, (std::vector<float>{8, 7, -5}));
}

TEST(CollectiveSignature, DescribesBothSidesOfAMismatch) {
  auto mine = CollectiveSignature::make(CollectiveKind::kAllreduce, DataType::kFloat32, 64,
                                        static_cast<std::uint32_t>(ReduceOp::kSum), 12);
  auto theirs = mine;
  theirs.count = 67;
  EXPECT_FALSE(mine.agrees_with(theirs));
  const auto msg = mismatch_message(mine, theirs, 3);
  EXPECT_NE(msg.find("rank 3 issued allreduce(sum, float32 x 67, #12)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("this rank issued allreduce(sum, float32 x 64, #12)"), std::string::npos)
      << msg;
  theirs = mine;
  theirs.payload_bytes = 999;  // payload size is not part of the agreement
  EXPECT_TRUE(mine.agrees_with(theirs));
}

}  // namespace
}  // namespace ddp::detail
