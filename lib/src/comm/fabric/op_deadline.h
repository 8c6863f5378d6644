#pragma once
// The clocks a fabric wait runs on: the op's deadline (with the cadence of its peer-liveness
// checks) and the backoff between empty polls. Both read the clock only on empty polls: most
// requests are complete by their first poll, and a small op waits on several, so an op whose
// completions are all in when polled reads no clock at all.
#include <chrono>

namespace ddp::detail::fabric {

using Clock = std::chrono::steady_clock;

// A time not yet taken.
inline constexpr Clock::time_point kNotYet = Clock::time_point::min();

// An op's deadline counts from its first empty poll; peers the op waits on are checked for
// liveness every `liveness_interval` from then on.
class OpDeadline {
 public:
  OpDeadline(std::chrono::milliseconds timeout, std::chrono::milliseconds liveness_interval)
      : timeout_(timeout), liveness_interval_(liveness_interval) {}

  std::chrono::milliseconds timeout() const { return timeout_; }
  // A new op: its clock starts at its first empty poll.
  void begin_op() { started_ = false; }
  bool started() const { return started_; }
  // An empty poll at `now` (starts the clock at the op's first). True when the peers' liveness
  // is due for a check, which also schedules the next one. Inline: a wait calls it on every
  // empty poll.
  bool liveness_check_due(Clock::time_point now) {
    if (!started_) start(now);
    if (now < next_liveness_check_) return false;
    next_liveness_check_ = now + liveness_interval_;
    return true;
  }
  bool expired(Clock::time_point now) const { return started_ && now >= deadline_; }
  // The op may run at most `grace` past `now` (starting its clock if need be).
  void limit(Clock::time_point now, std::chrono::milliseconds grace);

 private:
  void start(Clock::time_point now);

  std::chrono::milliseconds timeout_;
  std::chrono::milliseconds liveness_interval_;
  bool started_ = false;
  Clock::time_point deadline_;
  Clock::time_point next_liveness_check_;
};

// How a wait spends an empty poll: spin while completions are imminent, then yield the core
// (ranks may share cores with each other or with compute threads), then sleep in short naps.
// Polling only happens while a collective waits, never in the background.
class PollBackoff {
 public:
  explicit PollBackoff(std::chrono::microseconds spin) : spin_(spin) {}
  // Something completed: the next empty poll starts a new idle stretch.
  void reset() { idle_since_ = kNotYet; }
  // An empty poll at `now`.
  void pause(Clock::time_point now);
  // What pause(now) does, without doing it.
  enum class Step { kSpin, kYield, kSleep };
  Step step_at(Clock::time_point now) const;

  static constexpr auto kYieldFor = std::chrono::milliseconds(5);
  static constexpr auto kNap = std::chrono::microseconds(50);

 private:
  std::chrono::microseconds spin_;
  Clock::time_point idle_since_ = kNotYet;
};

}  // namespace ddp::detail::fabric
