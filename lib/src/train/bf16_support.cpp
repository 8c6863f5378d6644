#include "train/bf16_support.h"

#include <ATen/ATen.h>

#include <atomic>
#include <exception>
#include <mutex>
#include <string>

#include "base/cpu_features.h"
#include "ddp/log.h"
#include "ddp/settings.h"

namespace ddp::train::detail {
namespace {

// torch sends a bfloat16 matmul to oneDNN only above 16^3 multiply-adds; 17^3 is above.
constexpr int64_t kProbeSize = 17;

void warn_once(const std::string& why) {
  static std::atomic<bool> warned{false};
  if (!warned.exchange(true)) log::warn("bf16: {}; running in float32 instead", why);
}

}  // namespace

bool torch_multiplies_bf16() {
  static std::once_flag once;
  static bool works = false;
  static std::string failure;
  std::call_once(once, [] {
    try {
      const at::Tensor a = at::ones({kProbeSize, kProbeSize}, at::kBFloat16);
      const at::Tensor sum = at::addmm(at::zeros({kProbeSize}, at::kBFloat16), a, a);
      works = sum.to(at::kFloat).sum().item<float>() == kProbeSize * kProbeSize * kProbeSize;
      if (!works) failure = "a bfloat16 matmul gave a wrong sum";
    } catch (const std::exception& e) {
      failure = e.what();
      failure = failure.substr(0, failure.find('\n'));
    }
    if (!works) log::debug("bf16: this libtorch's bfloat16 matmul fails: {}", failure);
  });
  return works;
}

bool bf16_autocast_enabled(bool requested) {
  if (!requested) return false;
  const bool native =
      settings::boolean(settings::kTestCpuBf16).value_or(ddp::detail::cpu_computes_bf16_natively());
  if (!native) {
    warn_once(std::string("this CPU lacks ") + ddp::detail::native_bf16_feature() +
              " (native bfloat16 arithmetic), where bfloat16 autocast runs about 14 times slower "
              "than float32. For bf16, use a CPU with it (x86-64: Cooper Lake, Sapphire Rapids, "
              "Zen 4 or later; arm64: Graviton3 or later)");
    return false;
  }
  if (!torch_multiplies_bf16()) {
    warn_once(
        "this libtorch cannot multiply bfloat16 matrices on this CPU (its oneDNN has no bfloat16 "
        "matmul for it: Debian's torch 1.13 on arm64 with BF16, e.g. Graviton3). For bf16, use a "
        "libtorch whose oneDNN is built with the Arm Compute Library");
    return false;
  }
  return true;
}

}  // namespace ddp::train::detail
