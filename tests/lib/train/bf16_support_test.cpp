// --bf16 on a CPU without native bfloat16 falls back to float32 (with one warning) instead of
// running 14 times slower; on a CPU with it, bf16 stays on. DDP_TEST_CPU_BF16 plays either CPU.
#include "train/bf16_support.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <exception>

#include <fstream>
#include <sstream>
#include <string>

#include "base/cpu_features.h"
#include "ddp/error.h"
#include "scoped_env.h"

namespace ddp::train::detail {
namespace {

using ddp::testing::ScopedEnv;

TEST(Bf16Support, FallsBackToFloat32WhereTheCpuLacksNativeBfloat16) {
  ScopedEnv cpu("DDP_TEST_CPU_BF16", "0");
  EXPECT_FALSE(bf16_autocast_enabled(true));
  EXPECT_FALSE(bf16_autocast_enabled(true)) << "the second call is as the first (warned once)";
}

TEST(Bf16Support, StaysOnWhereTheCpuComputesInBfloat16) {
  ScopedEnv cpu("DDP_TEST_CPU_BF16", "1");
  // Where this libtorch can multiply bfloat16 matrices (every x86-64 build; not Debian's arm64
  // torch on a CPU with BF16: the next test).
  EXPECT_EQ(bf16_autocast_enabled(true), torch_multiplies_bf16());
}

// The probe says what a real bfloat16 matmul of a model's size does: it runs (x86-64, arm64
// without BF16), or throws (Debian's arm64 torch with BF16, in the arm64 label under qemu's
// BF16 CPUs), and then bf16 autocast is off.
TEST(Bf16Support, TheMatmulProbeAgreesWithAModelSizedMatmul) {
  bool ran = false;
  try {
    const at::Tensor x = at::randn({64, 256}).to(at::kBFloat16);
    const at::Tensor w = at::randn({128, 256}).to(at::kBFloat16);
    const at::Tensor y = at::addmm(at::zeros({128}, at::kBFloat16), x, w.t());
    ran = y.size(0) == 64 && y.size(1) == 128;
  } catch (const std::exception&) {
    ran = false;
  }
  EXPECT_EQ(torch_multiplies_bf16(), ran);
  if (!ran) {
    ScopedEnv cpu("DDP_TEST_CPU_BF16", "1");
    EXPECT_FALSE(bf16_autocast_enabled(true));
  }
}

TEST(Bf16Support, NotRequestedIsOffOnEveryCpu) {
  for (const char* answer : {"0", "1"}) {
    ScopedEnv cpu("DDP_TEST_CPU_BF16", answer);
    EXPECT_FALSE(bf16_autocast_enabled(false)) << answer;
  }
}

TEST(Bf16Support, AMalformedTestAnswerIsAConfigError) {
  ScopedEnv cpu("DDP_TEST_CPU_BF16", "maybe");
  EXPECT_THROW(bf16_autocast_enabled(true), ConfigError);
}

// The detection agrees with what the kernel reports in /proc/cpuinfo.
TEST(Bf16Support, DetectionAgreesWithProcCpuinfo) {
  std::ifstream cpuinfo("/proc/cpuinfo");
  if (!cpuinfo) GTEST_SKIP() << "no /proc/cpuinfo to compare with";
  std::string line;
  std::string flags;
  // x86-64 lists "flags", arm64 "Features". Under qemu-user /proc/cpuinfo is the host's, of
  // another architecture: nothing to compare with then.
#if defined(__aarch64__)
  const std::string key = "Features";
#else
  const std::string key = "flags";
#endif
  while (std::getline(cpuinfo, line)) {
    if (line.rfind(key, 0) == 0) {
      flags = " " + line.substr(line.find(':') + 1) + " ";
      break;
    }
  }
  if (flags.empty()) GTEST_SKIP() << "/proc/cpuinfo has no '" << key << "' line (emulated?)";
  const bool listed =
      flags.find(std::string(" ") + ddp::detail::native_bf16_feature() + " ") != std::string::npos;
  EXPECT_EQ(ddp::detail::cpu_computes_bf16_natively(), listed)
      << "looked for " << ddp::detail::native_bf16_feature() << " in" << flags;
  ScopedEnv cpu("DDP_TEST_CPU_BF16", nullptr);
  EXPECT_EQ(bf16_autocast_enabled(true), listed && torch_multiplies_bf16());
}

}  // namespace
}  // namespace ddp::train::detail
