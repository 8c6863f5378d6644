#include "ddp/log.h"

#include <exception>
#include <optional>
#include <string>

#include <spdlog/sinks/stdout_sinks.h>

#include "ddp/settings.h"

namespace ddp::log {
namespace {

std::shared_ptr<spdlog::logger> make_logger() {
  auto sink = std::make_shared<spdlog::sinks::stderr_sink_mt>();
  auto created = std::make_shared<spdlog::logger>("ddp", sink);
  created->set_pattern("[%H:%M:%S.%e] [ddp] [%l] %v");
  // A malformed level is reported by settings::validate_all() at the program's start; the logger
  // itself must not throw.
  std::optional<std::string> level;
  try {
    level = settings::spelling(settings::kLogLevel);
  } catch (const std::exception&) {
  }
  created->set_level(level ? spdlog::level::from_str(*level) : spdlog::level::info);
  return created;
}

}  // namespace

spdlog::logger& logger() {
  static std::shared_ptr<spdlog::logger> instance = make_logger();
  return *instance;
}

void set_rank(int rank) {
  logger().set_pattern("[%H:%M:%S.%e] [rank" + std::to_string(rank) + "] [%l] %v");
}

}  // namespace ddp::log
