#pragma once
// bfloat16 autocast on the CPU for one scope (libtorch's CPU autocast: convolutions and matrix
// products run in bfloat16, precision-sensitive ops in float32).
#include <ATen/autocast_mode.h>

namespace ddp::train::detail {

class AutocastScope {
 public:
  explicit AutocastScope(bool enabled) : enabled_(enabled) {
    if (!enabled_) return;
    previous_ = at::autocast::is_cpu_enabled();
    at::autocast::set_cpu_enabled(true);
    at::autocast::set_autocast_cpu_dtype(at::kBFloat16);
    at::autocast::increment_nesting();
  }
  ~AutocastScope() {
    if (!enabled_) return;
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    at::autocast::set_cpu_enabled(previous_);
  }
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  bool enabled_;
  bool previous_ = false;
};

}  // namespace ddp::train::detail
