#include "comm/fabric/op_deadline.h"

#include <sched.h>

#include <algorithm>
#include <thread>

namespace ddp::detail::fabric {

void OpDeadline::start(Clock::time_point now) {
  started_ = true;
  deadline_ = now + timeout_;
  next_liveness_check_ = now + liveness_interval_;
}

void OpDeadline::limit(Clock::time_point now, std::chrono::milliseconds grace) {
  if (!started_) start(now);
  deadline_ = std::min(deadline_, now + grace);
}

PollBackoff::Step PollBackoff::step_at(Clock::time_point now) const {
  if (idle_since_ == kNotYet) return Step::kSpin;
  const auto idle = now - idle_since_;
  if (idle < spin_) return Step::kSpin;
  return idle < kYieldFor ? Step::kYield : Step::kSleep;
}

void PollBackoff::pause(Clock::time_point now) {
  const Step step = step_at(now);
  if (idle_since_ == kNotYet) idle_since_ = now;
  if (step == Step::kYield) sched_yield();
  if (step == Step::kSleep) std::this_thread::sleep_for(kNap);
}

}  // namespace ddp::detail::fabric
