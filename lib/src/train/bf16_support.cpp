#include "train/bf16_support.h"

#include <atomic>

#include "base/cpu_features.h"
#include "ddp/log.h"
#include "ddp/settings.h"

namespace ddp::train::detail {

bool bf16_autocast_enabled(bool requested) {
  if (!requested) return false;
  const bool native =
      settings::boolean(settings::kTestCpuBf16).value_or(ddp::detail::cpu_computes_bf16_natively());
  if (native) return true;
  static std::atomic<bool> warned{false};
  if (!warned.exchange(true)) {
    log::warn(
        "bf16: this CPU lacks {} (native bfloat16 arithmetic), where bfloat16 autocast runs about "
        "14 times slower than float32; running in float32 instead. For bf16, use a CPU with it "
        "(x86-64: Cooper Lake, Sapphire Rapids, Zen 4 or later; arm64: Graviton3 or later)",
        ddp::detail::native_bf16_feature());
  }
  return false;
}

}  // namespace ddp::train::detail
