#pragma once
// Training metrics as JSON Lines: one object per event ({"event": "step", "time": <unix s>, ...}),
// appended and flushed as they happen, so a dashboard or `jq` can follow a run live and a killed
// run keeps every line it wrote.
#include <cstdint>
#include <fstream>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace ddp::train {

using MetricValue = std::variant<int64_t, double, bool, std::string, std::vector<double>>;
using MetricFields = std::vector<std::pair<std::string, MetricValue>>;

class MetricsLog {
 public:
  MetricsLog() = default;  // writes nothing
  // Appends to `path` (creating it). Throws DataError if it cannot be opened.
  explicit MetricsLog(const std::string& path);

  bool enabled() const { return out_.is_open(); }
  void write(const std::string& event, const MetricFields& fields);

 private:
  std::ofstream out_;
};

// Seconds since the Unix epoch, with sub-millisecond resolution.
double unix_time();

}  // namespace ddp::train
