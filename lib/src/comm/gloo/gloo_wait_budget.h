#pragma once
// What is left of a deadline, as the timeout of one gloo wait.
#include <algorithm>
#include <chrono>

namespace ddp::detail {

// At least 1 ms, so a deadline already past never becomes gloo's "unset" value (-1 ms), which
// would mean the context's own timeout.
inline std::chrono::milliseconds gloo_wait_budget(std::chrono::steady_clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline - std::chrono::steady_clock::now());
  return std::max(left, std::chrono::milliseconds(1));
}

}  // namespace ddp::detail
