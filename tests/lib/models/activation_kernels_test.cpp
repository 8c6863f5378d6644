// The fused activation loops' instruction-set variants: each must compute exactly the bits of
// the portable baseline, on awkward shapes (no multiple of any vector width), with ties, NaN
// and dropout, so that a node's CPU never changes what training computes.
#include <cstdint>
#include <cstring>
#include <iostream>
#include <limits>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include <c10/util/BFloat16.h>
#include <gtest/gtest.h>

#include "base/cpu_features.h"
#include "ddp/error.h"
#include "models/activation_kernels.h"

namespace ddp::models::detail {

// Found by argument-dependent lookup, so it lives in Precision's own namespace.
void PrintTo(Precision p, std::ostream* os) { *os << (p == Precision::kFloat32 ? "fp32" : "bf16"); }

namespace {

struct Case {
  Precision precision;
  bool channels_last;
};

std::string name(const ::testing::TestParamInfo<Case>& info) {
  return std::string(info.param.precision == Precision::kFloat32 ? "fp32" : "bf16") +
         (info.param.channels_last ? "_channels_last" : "_nchw");
}

// Random activations in the element type's bytes: small integers (many ties within a window),
// fractions, and a few NaNs.
std::vector<uint8_t> activations(Precision precision, int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> small(-4, 4);
  std::normal_distribution<float> normal;
  std::vector<uint8_t> bytes(static_cast<std::size_t>(n) * 4);
  for (int64_t i = 0; i < n; ++i) {
    float v = (i % 3 == 0) ? static_cast<float>(small(rng)) : normal(rng);
    if (i % 97 == 5) v = std::numeric_limits<float>::quiet_NaN();
    if (precision == Precision::kFloat32) {
      std::memcpy(bytes.data() + 4 * i, &v, 4);
    } else {
      uint32_t u;
      std::memcpy(&u, &v, 4);
      const auto bits = static_cast<uint16_t>(u >> 16);  // any bfloat16 pattern will do
      std::memcpy(bytes.data() + 2 * i, &bits, 2);
    }
  }
  return bytes;
}

void PrintTo(const Case& c, std::ostream* os) {
  *os << (c.precision == Precision::kFloat32 ? "fp32" : "bf16")
      << (c.channels_last ? " channels-last" : " NCHW");
}

class WithWideVariant {
 protected:
  // Returns false (and the test skips) where there is nothing to compare.
  bool has_fast_variant() {
    fast_ = activation_kernels_for("avx512");
    if (!fast_) fast_ = activation_kernels_for("sve");
    return fast_ != nullptr;
  }
  const ActivationKernels& baseline_ = *activation_kernels_for("baseline");
  const ActivationKernels* fast_ = nullptr;
};

constexpr const char* kNoWideVariant =
    "this build or CPU has no wider variant (AVX-512 needs an x86-64 build and an x86-64-v4 CPU, "
    "SVE an arm64 build and an SVE CPU); only the baseline runs here";

class ActivationKernelVariants : public ::testing::TestWithParam<Case>, public WithWideVariant {
 protected:
  void SetUp() override {
    if (!has_fast_variant()) GTEST_SKIP() << kNoWideVariant;
  }
};

class ReluDropoutVariants : public ::testing::TestWithParam<Precision>, public WithWideVariant {
 protected:
  void SetUp() override {
    if (!has_fast_variant()) GTEST_SKIP() << kNoWideVariant;
  }
};

TEST_P(ActivationKernelVariants, PoolGivesTheBaselineBits) {
  const auto [precision, channels_last] = GetParam();
  const std::size_t element = precision == Precision::kFloat32 ? 4 : 2;
  // Odd W (the last column is outside every window), short lines in both layouts, and lines
  // long enough for the vector loops (41 outputs per NCHW row, 37 channels per pixel).
  for (const PoolGeometry& g :
       {PoolGeometry{3, 37, 14, 19, 7, 9}, PoolGeometry{2, 37, 6, 83, 3, 41}}) {
    SCOPED_TRACE("W = " + std::to_string(g.W));
    const int64_t per_image = g.C * g.OH * g.OW;
    const int64_t in_n = g.B * g.C * g.H * g.W, out_n = g.B * per_image;
    const std::vector<uint8_t> in = activations(precision, in_n, 1);
    const std::vector<uint8_t> grad = activations(precision, out_n, 2);
    const DropoutMask mask{0x5EEDull, 16384, 4.0f / 3.0f};
    for (const DropoutMask* m : {static_cast<const DropoutMask*>(nullptr), &mask}) {
      SCOPED_TRACE(m ? "with dropout" : "without dropout");
      struct Result {
        std::vector<uint8_t> out, arg, grad_in;
      } results[2];
      const ActivationKernels* variants[2] = {&baseline_, fast_};
      for (int v = 0; v < 2; ++v) {
        Result& r = results[v];
        r.out.assign(out_n * element, 0);
        r.arg.assign(out_n, 0);
        r.grad_in.assign(in_n * element, 0);
        std::vector<float> multipliers(per_image);
        std::vector<uint16_t> draws(per_image + 3);
        variants[v]->pool_forward(precision, channels_last, g, in.data(), r.out.data(),
                                  r.arg.data(), m, multipliers.data(), draws.data());
        variants[v]->pool_backward(precision, channels_last, g, grad.data(), r.out.data(),
                                   r.arg.data(), r.grad_in.data(), m ? m->scale : 1.0f);
      }
      EXPECT_EQ(results[0].out, results[1].out);
      EXPECT_EQ(results[0].arg, results[1].arg);
      EXPECT_EQ(results[0].grad_in, results[1].grad_in);
    }
  }
}

TEST_P(ReluDropoutVariants, GiveTheBaselineBits) {
  const Precision precision = GetParam();
  const std::size_t element = precision == Precision::kFloat32 ? 4 : 2;
  const int64_t rows = 5, cols = 133, n = rows * cols;
  const std::vector<uint8_t> x = activations(precision, n, 3);
  const std::vector<uint8_t> grad = activations(precision, n, 4);
  const DropoutMask mask{0xD20Full, 32768, 2.0f};
  for (const DropoutMask* m : {static_cast<const DropoutMask*>(nullptr), &mask}) {
    SCOPED_TRACE(m ? "with dropout" : "without dropout");
    std::vector<uint8_t> out[2], grad_in[2];
    const ActivationKernels* variants[2] = {&baseline_, fast_};
    for (int v = 0; v < 2; ++v) {
      out[v].assign(n * element, 0);
      grad_in[v].assign(n * element, 0);
      std::vector<float> multipliers(cols);
      std::vector<uint16_t> draws(cols + 3);
      variants[v]->relu_dropout_forward(precision, x.data(), out[v].data(), rows, cols, m,
                                        multipliers.data(), draws.data());
      variants[v]->relu_dropout_backward(precision, grad.data(), out[v].data(), grad_in[v].data(),
                                         n, m ? m->scale : 1.0f);
    }
    EXPECT_EQ(out[0], out[1]);
    EXPECT_EQ(grad_in[0], grad_in[1]);
  }
}

// Every variant's casts give c10's bits: float -> bfloat16 rounds to nearest even (ties, the
// largest finite values rounding to infinity, every NaN to 0x7FC0), bfloat16 -> float widens.
TEST(ActivationKernelCasts, MatchC10InEveryVariant) {
  std::vector<float> floats;
  for (uint32_t high = 0; high <= 0xFFFF; ++high) {
    for (uint32_t low : {0x0000u, 0x0001u, 0x7FFFu, 0x8000u, 0x8001u, 0xFFFFu}) {
      const uint32_t bits = high << 16 | low;
      float f;
      std::memcpy(&f, &bits, 4);
      floats.push_back(f);
    }
  }
  std::vector<uint16_t> expected_narrow(floats.size());
  for (std::size_t i = 0; i < floats.size(); ++i) expected_narrow[i] = c10::BFloat16(floats[i]).x;
  std::vector<uint16_t> all_patterns(0x10000);
  std::vector<float> expected_wide(all_patterns.size());
  for (uint32_t b = 0; b <= 0xFFFF; ++b) {
    all_patterns[b] = static_cast<uint16_t>(b);
    expected_wide[b] =
        static_cast<float>(c10::BFloat16(static_cast<uint16_t>(b), c10::BFloat16::from_bits()));
  }
  for (const char* isa : {"baseline", "avx512", "sve"}) {
    const ActivationKernels* k = activation_kernels_for(isa);
    if (!k) {
      std::cout << "[ NOTE ] no " << isa << " variant here: " << kNoWideVariant << "\n";
      continue;
    }
    SCOPED_TRACE(isa);
    std::vector<uint16_t> narrow(floats.size());
    k->to_bfloat16(floats.data(), narrow.data(), static_cast<int64_t>(floats.size()));
    EXPECT_EQ(narrow, expected_narrow);
    std::vector<float> wide(all_patterns.size());
    k->to_float32(all_patterns.data(), wide.data(), static_cast<int64_t>(wide.size()));
    EXPECT_EQ(std::memcmp(wide.data(), expected_wide.data(), wide.size() * 4), 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Variants, ActivationKernelVariants,
                         ::testing::Values(Case{Precision::kFloat32, false},
                                           Case{Precision::kFloat32, true},
                                           Case{Precision::kBFloat16, false},
                                           Case{Precision::kBFloat16, true}),
                         name);
INSTANTIATE_TEST_SUITE_P(Variants, ReluDropoutVariants,
                         ::testing::Values(Precision::kFloat32, Precision::kBFloat16),
                         [](const ::testing::TestParamInfo<Precision>& info) {
                           return info.param == Precision::kFloat32 ? "fp32" : "bf16";
                         });

TEST(ActivationKernelSelection, BaselineIsAlwaysThere) {
  ASSERT_NE(activation_kernels_for("baseline"), nullptr);
  EXPECT_STREQ(select_activation_kernels("baseline").isa, "baseline");
}

TEST(ActivationKernelSelection, UnknownCapIsAConfigErrorNamingTheVariable) {
  try {
    select_activation_kernels("sse9");
    FAIL() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("DDP_ISA='sse9'"), std::string::npos) << e.what();
  }
}

// Every set this CPU runs that has activation kernels is the one chosen with no cap.
TEST(ActivationKernelSelection, NoCapTakesTheWidestVariantThisCpuRuns) {
  const char* widest = ddp::detail::cpu_runs_isa("avx512") ? "avx512"
                       : ddp::detail::cpu_runs_isa("sve")  ? "sve"
                                                           : "baseline";
  EXPECT_STREQ(select_activation_kernels(nullptr).isa, widest);
}

// There is no avx2 variant: an avx2 cap keeps the activations on the baseline.
TEST(ActivationKernelSelection, AnAvx2CapTakesTheBaseline) {
  if (!ddp::detail::cpu_runs_x86_64_v3()) GTEST_SKIP() << "this CPU does not run x86-64-v3";
  EXPECT_STREQ(select_activation_kernels("avx2").isa, "baseline");
}

}  // namespace
}  // namespace ddp::models::detail
