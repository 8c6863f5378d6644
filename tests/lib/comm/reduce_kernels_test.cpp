#include "comm/reduce_kernels.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "base/cpu_features.h"
#include "comm/collective_signature.h"
#include "ddp/error.h"

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

// Random bit patterns: every class of value turns up (NaNs with payloads, infinities, signed
// zeros, subnormals), plus runs of equal and opposite values for min/max ties.
template <typename Bits>
std::vector<Bits> random_bits(std::size_t n, std::mt19937_64& rng) {
  std::vector<Bits> v(n);
  for (auto& x : v) x = static_cast<Bits>(rng());
  return v;
}

// Lengths around every vector width and unrolling, and past a few KiB.
const std::size_t kAwkwardLengths[] = {0,  1,  3,  7,   8,   15,  16,  17,   31,  33,
                                       63, 64, 65, 127, 129, 255, 257, 1000, 4099};

// `variant` against the baseline, bit for bit, for one element type (given as its bits).
template <typename Bits>
void expect_same_bits(const ReduceKernels& variant, DataType dtype) {
  const ReduceKernels& baseline = *reduce_kernels_for("baseline");
  const auto& v = variant.by_type[static_cast<int>(dtype)];
  const auto& b = baseline.by_type[static_cast<int>(dtype)];
  std::mt19937_64 rng(11);
  for (std::size_t n : kAwkwardLengths) {
    auto x = random_bits<Bits>(n, rng);
    auto y = random_bits<Bits>(n, rng);
    for (std::size_t i = 0; i + 1 < n; i += 5) y[i] = x[i];  // ties
    const auto same = [&](const std::vector<Bits>& got, const std::vector<Bits>& want,
                          const char* what) {
      ASSERT_EQ(std::memcmp(got.data(), want.data(), n * sizeof(Bits)), 0)
          << variant.isa << " " << what << " " << to_string(dtype) << " n=" << n;
    };
    for (auto [name, mine, theirs] :
         {std::tuple{"sum", v.sum, b.sum}, {"min", v.min, b.min}, {"max", v.max, b.max}}) {
      std::vector<Bits> got(n), want(n);
      mine(got.data(), x.data(), y.data(), n);
      theirs(want.data(), x.data(), y.data(), n);
      same(got, want, name);
      std::vector<Bits> in_place = x;  // out aliasing an input
      mine(in_place.data(), in_place.data(), y.data(), n);
      same(in_place, want, name);
    }
    for (int divisor : {2, 3, 8, 7}) {
      std::vector<Bits> got(n), want(n);
      v.sum_divide(got.data(), x.data(), y.data(), n, divisor);
      b.sum_divide(want.data(), x.data(), y.data(), n, divisor);
      same(got, want, "sum_divide");
      got = x;
      want = x;
      v.divide(got.data(), n, divisor);
      b.divide(want.data(), n, divisor);
      same(got, want, "divide");
    }
  }
}

// Integers: random values, not bit patterns, so that a sum does not overflow (undefined).
template <typename T>
void expect_same_integers(const ReduceKernels& variant, DataType dtype) {
  const auto& v = variant.by_type[static_cast<int>(dtype)];
  const auto& b = reduce_kernels_for("baseline")->by_type[static_cast<int>(dtype)];
  std::mt19937_64 rng(13);
  std::uniform_int_distribution<T> value(std::numeric_limits<T>::min() / 2,
                                         std::numeric_limits<T>::max() / 2);
  for (std::size_t n : kAwkwardLengths) {
    std::vector<T> x(n), y(n);
    for (std::size_t i = 0; i < n; ++i) {
      x[i] = value(rng);
      y[i] = i % 5 == 0 ? x[i] : value(rng);
    }
    for (auto [mine, theirs] : {std::pair{v.sum, b.sum}, {v.min, b.min}, {v.max, b.max}}) {
      std::vector<T> got(n), want(n);
      mine(got.data(), x.data(), y.data(), n);
      theirs(want.data(), x.data(), y.data(), n);
      ASSERT_EQ(got, want) << variant.isa << " " << to_string(dtype) << " n=" << n;
    }
    for (int divisor : {2, 3, 8}) {
      std::vector<T> got(n), want(n);
      v.sum_divide(got.data(), x.data(), y.data(), n, divisor);
      b.sum_divide(want.data(), x.data(), y.data(), n, divisor);
      ASSERT_EQ(got, want) << variant.isa << " sum_divide n=" << n;
    }
  }
}

// Ranks on different CPUs (or with DDP_REDUCE_ISA set differently) reduce parts of one result
// each: the wider variants must compute the baseline's bits, NaN, signed zeros and ties
// included.
TEST(ReduceKernels, EveryVariantThisCpuRunsComputesTheBaselinesBits) {
  int checked = 0;
  for (int i = 1; i < kernel_isa_count(); ++i) {
    const char* isa = kernel_isa(i);
    const ReduceKernels* variant = reduce_kernels_for(isa);
    if (!variant) {
      std::printf("%s reduction kernels: not in this build or not run by this CPU, not checked\n",
                  isa);
      continue;
    }
    ++checked;
    expect_same_bits<std::uint32_t>(*variant, DataType::kFloat32);
    expect_same_bits<std::uint64_t>(*variant, DataType::kFloat64);
    expect_same_bits<std::uint16_t>(*variant, DataType::kBFloat16);
    expect_same_bits<std::uint16_t>(*variant, DataType::kFloat16);
    expect_same_integers<std::int32_t>(*variant, DataType::kInt32);
    expect_same_integers<std::int64_t>(*variant, DataType::kInt64);
  }
  if (checked == 0) GTEST_SKIP() << "no wider reduction kernels run here; the baseline is all";
}

// The baseline's bfloat16 loops (raw bits) give c10's results for every class of value.
TEST(ReduceKernels, BFloat16MatchesC10OnRandomBitPatterns) {
  std::mt19937_64 rng(17);
  const auto x = random_bits<std::uint16_t>(4099, rng);
  const auto y = random_bits<std::uint16_t>(4099, rng);
  std::vector<std::uint16_t> sum(x.size()), mx(x.size());
  const auto& b = reduce_kernels_for("baseline")->by_type[static_cast<int>(DataType::kBFloat16)];
  b.sum(sum.data(), x.data(), y.data(), x.size());
  b.max(mx.data(), x.data(), y.data(), x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    const float fx = static_cast<float>(c10::BFloat16(x[i], c10::BFloat16::from_bits()));
    const float fy = static_cast<float>(c10::BFloat16(y[i], c10::BFloat16::from_bits()));
    ASSERT_EQ(sum[i], c10::BFloat16(fx + fy).x) << i;
    ASSERT_EQ(mx[i], c10::BFloat16(std::max(fx, fy)).x) << i;
  }
}

TEST(ReduceKernels, AnUnknownOrUnsupportedCapIsAConfigErrorNamingTheVariable) {
  try {
    select_reduce_kernels("sse9");
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("DDP_ISA='sse9'"), std::string::npos) << e.what();
  }
  for (int i = 1; i < kernel_isa_count(); ++i) {
    const char* isa = kernel_isa(i);
    if (cpu_runs_isa(isa)) continue;
    try {
      select_reduce_kernels(isa);
      ADD_FAILURE() << "a cap of " << isa << " was accepted on a CPU that does not run it";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("DDP_ISA=") + isa), std::string::npos)
          << e.what();
    }
  }
  EXPECT_STREQ(select_reduce_kernels("baseline").isa, "baseline");
  // A cap of avx2 takes avx2 where the CPU runs it, even where it runs avx512.
  if (cpu_runs_x86_64_v3() && reduce_kernels_for("avx2")) {
    EXPECT_STREQ(select_reduce_kernels("avx2").isa, "avx2");
  }
  // Unset: the widest this CPU runs; every set this CPU runs has its kernels in this build.
  const char* widest = "baseline";
  for (int i = 1; i < kernel_isa_count(); ++i) {
    const char* isa = kernel_isa(i);
    EXPECT_EQ(reduce_kernels_for(isa) != nullptr, cpu_runs_isa(isa)) << isa;
    if (reduce_kernels_for(isa)) widest = isa;
  }
  EXPECT_STREQ(select_reduce_kernels(nullptr).isa, widest);
  // A set of the other architecture is not known here.
#if defined(__aarch64__)
  EXPECT_THROW(select_reduce_kernels("avx2"), ConfigError);
#else
  EXPECT_THROW(select_reduce_kernels("sve"), ConfigError);
#endif
}

// Under qemu-aarch64 (the arm64 label) QEMU_CPU names the CPU model: qemu's max has SVE and BF16,
// neoverse-n1 and cortex-a72 neither. The kernels chosen must follow, so that a broken hwcap check
// cannot turn the label's exactness tests into skips.
TEST(ReduceKernels, UnderQemuTheCpuModelPicksTheKernels) {
#if !defined(__aarch64__)
  GTEST_SKIP() << "arm64 only (the arm64 label runs it under qemu)";
#else
  const char* cpu = std::getenv("QEMU_CPU");
  if (cpu == nullptr) GTEST_SKIP() << "QEMU_CPU is not set: not under the arm64 label's qemu";
  const bool max = std::string(cpu).rfind("max", 0) == 0;
  EXPECT_EQ(cpu_runs_sve(), max) << cpu;
  EXPECT_EQ(cpu_computes_bf16_natively(), max) << cpu;
  EXPECT_STREQ(select_reduce_kernels(nullptr).isa, max ? "sve" : "baseline") << cpu;
#endif
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
