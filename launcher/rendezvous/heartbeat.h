#pragma once
// Liveness of the nodes of a round. Every agent adds 1 to its own counter in the store
// (round<R>/beat/<group rank>) each keep-alive interval while it supervises its workers, and
// marks it (kFinished) once it stops on purpose; the agent that serves the store reads all
// counters at once, five times an interval, and declares lost a node whose counter has not moved
// for max_attempts intervals. A node that dies with its sockets closed is seen at once
// by its peers' collectives; this catches the one that vanishes without a word (power loss, a
// partition, a deleted network namespace), which its peers would otherwise wait on until the
// collective timeout (DDP_TIMEOUT_SEC, 30 minutes by default).
//
// Counters rather than timestamps: no two hosts' clocks are compared. The logic is apart from
// the store, so that it is unit-tested (tests/launcher/rendezvous/heartbeat_test.cpp).
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "ddp/error.h"

namespace ddprun {

class HeartbeatMonitor {
 public:
  using Clock = std::chrono::steady_clock;
  // Added to a node's counter when it stops beating on purpose (its workers finished, or its
  // round ended and it acknowledged the stop): it is not lost.
  static constexpr int64_t kFinished = int64_t{1} << 40;

  HeartbeatMonitor(int nodes, std::chrono::milliseconds interval, int max_attempts,
                   Clock::time_point now);

  // Whether this agent's own beat is due (at most once per interval).
  bool beat_due(Clock::time_point now);
  // Whether the counters are due to be read (the watching agent, every check_period()): a node
  // is then named within a fifth of an interval of its limit.
  bool check_due(Clock::time_point now);
  std::chrono::milliseconds check_period() const;
  // Takes the counters read from the store (one per group rank; missing: 0) and returns the
  // group ranks whose counter has not moved for the limit, each once.
  std::vector<int> observe(const std::vector<int64_t>& counters, Clock::time_point now);

  // How long a node may stay silent.
  std::chrono::milliseconds limit() const { return interval_ * max_attempts_; }
  // Whether every node but `self` marked its counter (kFinished) at the last observe().
  bool all_stopped_but(int self) const;
  // When the next beat or check is due.
  Clock::time_point next_due() const { return std::min(next_beat_, next_check_); }

 private:
  std::chrono::milliseconds interval_;
  int max_attempts_;
  Clock::time_point next_beat_;
  Clock::time_point next_check_;
  std::vector<int64_t> last_count_;
  std::vector<Clock::time_point> last_change_;
  std::vector<bool> declared_;
};

// What a request to the store that went unanswered for the heartbeat limit means, for the one line
// an agent logs: the store's host at host:port vanished without closing its connections.
// `detail`: the error.
std::string store_silence_message(const std::string& host, int port,
                                  std::chrono::milliseconds limit, const std::string& detail);

// Runs `fn`, a request on a connection whose requests give up after `limit` (the agent's
// monitoring connection: StoreRendezvous::monitored, and the hang watch's requests in the
// supervisor). A StoreError after (nearly) that long is the store's host gone silent, and is
// rethrown so worded; an earlier one is not silence and goes on as it is.
template <typename Fn>
auto within_heartbeat_limit(const std::string& host, int port, std::chrono::milliseconds limit,
                            Fn&& fn) -> decltype(fn()) {
  const auto start = std::chrono::steady_clock::now();
  try {
    return fn();
  } catch (const ddp::StoreError& e) {
    if (std::chrono::steady_clock::now() - start < limit * 9 / 10) throw;
    throw ddp::StoreError(store_silence_message(host, port, limit, e.what()));
  }
}

}  // namespace ddprun
