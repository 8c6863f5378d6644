#include "ddp/train/metrics_log.h"

#include <cerrno>
#include <chrono>
#include <cstring>

#include <nlohmann/json.hpp>

#include "ddp/error.h"

namespace ddp::train {

MetricsLog::MetricsLog(const std::string& path) : out_(path, std::ios::app) {
  if (!out_)
    throw DataError(path, std::string("cannot open metrics file: ") + std::strerror(errno));
}

void MetricsLog::write(const std::string& event, const MetricFields& fields) {
  if (!enabled()) return;
  nlohmann::json line;
  line["event"] = event;
  line["time"] = unix_time();
  for (const auto& [key, value] : fields) {
    std::visit([&line, &key](const auto& v) { line[key] = v; }, value);
  }
  out_ << line.dump() << '\n';
  out_.flush();
}

double unix_time() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace ddp::train
