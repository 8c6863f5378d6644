#pragma once
// One rank-aware logger for the whole library: every line carries "[rankN]" once the rank is
// known. The level comes from DDP_LOG_LEVEL (trace, debug, info, warn, error, off; default info).
#include <memory>

#include <spdlog/spdlog.h>

namespace ddp::log {

// The shared "ddp" logger, writing to stderr.
spdlog::logger& logger();

// Tags every following line with the rank (called once the rank is known).
void set_rank(int rank);

template <typename... Args>
void debug(spdlog::format_string_t<Args...> fmt, Args&&... args) {
  logger().debug(fmt, std::forward<Args>(args)...);
}
template <typename... Args>
void info(spdlog::format_string_t<Args...> fmt, Args&&... args) {
  logger().info(fmt, std::forward<Args>(args)...);
}
template <typename... Args>
void warn(spdlog::format_string_t<Args...> fmt, Args&&... args) {
  logger().warn(fmt, std::forward<Args>(args)...);
}
template <typename... Args>
void error(spdlog::format_string_t<Args...> fmt, Args&&... args) {
  logger().error(fmt, std::forward<Args>(args)...);
}

}  // namespace ddp::log
