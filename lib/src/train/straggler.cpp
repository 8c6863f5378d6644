#include "train/straggler.h"

#include <algorithm>
#include <cstdio>

#include "ddp/comm/communicator.h"

namespace ddp::train::detail {

double median(std::vector<double> values) {
  if (values.empty()) return 0;
  const std::size_t middle = values.size() / 2;
  std::nth_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(middle),
                   values.end());
  const double upper = values[middle];
  if (values.size() % 2 == 1) return upper;
  const double lower =
      *std::max_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(middle));
  return (lower + upper) / 2;
}

std::vector<Straggler> find_stragglers(const std::vector<double>& compute_ms, double threshold) {
  std::vector<Straggler> found;
  const double middle = median(compute_ms);
  if (!(middle > 0)) return found;
  for (std::size_t r = 0; r < compute_ms.size(); ++r) {
    const double ratio = compute_ms[r] / middle;
    if (ratio > threshold) found.push_back({static_cast<int>(r), compute_ms[r], ratio});
  }
  std::sort(found.begin(), found.end(), [](const Straggler& a, const Straggler& b) {
    return a.ratio != b.ratio ? a.ratio > b.ratio : a.rank < b.rank;
  });
  return found;
}

std::string describe(const Straggler& straggler, int node, double median_ms, int64_t steps) {
  char where[32] = "";
  if (node >= 0) std::snprintf(where, sizeof where, " (node %d)", node);
  char text[200];
  std::snprintf(text, sizeof text,
                "rank %d%s computes %.2fx slower than the median (%.1f vs %.1f ms/step over %lld "
                "steps)",
                straggler.rank, where, straggler.ratio, straggler.compute_ms, median_ms,
                static_cast<long long>(steps));
  return text;
}

void StragglerMonitor::add_step(double compute_seconds, double wait_seconds) {
  ++steps_;
  compute_seconds_ += std::max(0.0, compute_seconds);
  wait_seconds_ += std::max(0.0, wait_seconds);
}

StragglerReport StragglerMonitor::share(Communicator& comm) {
  StragglerReport report;
  report.steps = steps_;
  const double steps = static_cast<double>(std::max<int64_t>(steps_, 1));
  std::vector<double> mine{compute_seconds_ * 1e3 / steps, wait_seconds_ * 1e3 / steps};
  std::vector<double> all(2 * static_cast<std::size_t>(comm.size()));
  comm.allgather(mine, all);
  for (int r = 0; r < comm.size(); ++r) {
    report.compute_ms.push_back(all[2 * static_cast<std::size_t>(r)]);
    report.wait_ms.push_back(all[2 * static_cast<std::size_t>(r) + 1]);
  }
  report.median_compute_ms = median(report.compute_ms);
  report.stragglers = find_stragglers(report.compute_ms, threshold_);
  steps_ = 0;
  compute_seconds_ = 0;
  wait_seconds_ = 0;
  return report;
}

}  // namespace ddp::train::detail
