#include "rendezvous/heartbeat.h"

#include <fmt/format.h>

#include <algorithm>

namespace ddprun {

HeartbeatMonitor::HeartbeatMonitor(int nodes, std::chrono::milliseconds interval, int max_attempts,
                                   Clock::time_point now)
    : interval_(interval),
      max_attempts_(std::max(max_attempts, 1)),
      next_beat_(now),
      next_check_(now + check_period()),
      last_count_(static_cast<std::size_t>(nodes), -1),
      last_change_(static_cast<std::size_t>(nodes), now),
      declared_(static_cast<std::size_t>(nodes), false) {}

bool HeartbeatMonitor::beat_due(Clock::time_point now) {
  if (now < next_beat_) return false;
  next_beat_ = now + interval_;
  return true;
}

bool HeartbeatMonitor::check_due(Clock::time_point now) {
  if (now < next_check_) return false;
  next_check_ = now + check_period();
  return true;
}

std::chrono::milliseconds HeartbeatMonitor::check_period() const {
  return std::max(interval_ / 5, std::chrono::milliseconds(1));
}

bool HeartbeatMonitor::all_stopped_but(int self) const {
  for (std::size_t g = 0; g < last_count_.size(); ++g) {
    if (static_cast<int>(g) != self && last_count_[g] < kFinished) return false;
  }
  return true;
}

std::vector<int> HeartbeatMonitor::observe(const std::vector<int64_t>& counters,
                                           Clock::time_point now) {
  std::vector<int> lost;
  for (std::size_t g = 0; g < last_count_.size(); ++g) {
    const int64_t count = g < counters.size() ? counters[g] : 0;
    if (count >= kFinished) {
      last_count_[g] = count;
      continue;
    }
    if (count != last_count_[g]) {
      last_count_[g] = count;
      last_change_[g] = now;
      continue;
    }
    if (!declared_[g] && now - last_change_[g] >= limit()) {
      declared_[g] = true;
      lost.push_back(static_cast<int>(g));
    }
  }
  return lost;
}

std::string store_silence_message(const std::string& host, int port,
                                  std::chrono::milliseconds limit, const std::string& detail) {
  return fmt::format(
      "the rendezvous store's host ({}:{}) did not answer this node within {:.1f} s: its pod "
      "vanished without closing its connections (deleted, powered off, or cut off from the "
      "network) ({})",
      host, port, std::chrono::duration<double>(limit).count(), detail);
}

}  // namespace ddprun
