// The clocks a fabric wait runs on (lib/src/comm/fabric/op_deadline.h): when an op's deadline
// starts and passes, how often peers' liveness is checked, the abort grace, and the backoff's
// spin, yield and sleep stretches. Time points are given, never read.
#include "comm/fabric/op_deadline.h"

#include <gtest/gtest.h>

namespace ddp::detail::fabric {
namespace {

using std::chrono::microseconds;
using std::chrono::milliseconds;

const Clock::time_point kT0 = Clock::time_point() + std::chrono::hours(1);

TEST(OpDeadline, StartsAtTheFirstEmptyPollAndExpiresATimeoutLater) {
  OpDeadline deadline(milliseconds(1000), milliseconds(100));
  deadline.begin_op();
  EXPECT_FALSE(deadline.started());
  EXPECT_FALSE(deadline.expired(kT0 + milliseconds(5000)));  // no clock yet: never expired
  EXPECT_FALSE(deadline.liveness_check_due(kT0));            // starts the clock at kT0
  EXPECT_TRUE(deadline.started());
  EXPECT_FALSE(deadline.expired(kT0 + milliseconds(999)));
  EXPECT_TRUE(deadline.expired(kT0 + milliseconds(1000)));
  EXPECT_EQ(deadline.timeout(), milliseconds(1000));
}

TEST(OpDeadline, EachOpGetsAFreshClock) {
  OpDeadline deadline(milliseconds(1000), milliseconds(100));
  deadline.begin_op();
  (void)deadline.liveness_check_due(kT0);
  ASSERT_TRUE(deadline.expired(kT0 + milliseconds(1500)));
  deadline.begin_op();
  EXPECT_FALSE(deadline.started());
  (void)deadline.liveness_check_due(kT0 + milliseconds(1500));
  EXPECT_FALSE(deadline.expired(kT0 + milliseconds(2000)));
  EXPECT_TRUE(deadline.expired(kT0 + milliseconds(2500)));
}

TEST(OpDeadline, LivenessIsCheckedOncePerInterval) {
  OpDeadline deadline(milliseconds(10000), milliseconds(100));
  deadline.begin_op();
  EXPECT_FALSE(deadline.liveness_check_due(kT0));
  EXPECT_FALSE(deadline.liveness_check_due(kT0 + milliseconds(99)));
  EXPECT_TRUE(deadline.liveness_check_due(kT0 + milliseconds(100)));
  // The next check counts from the one just due, not from the op's start.
  EXPECT_FALSE(deadline.liveness_check_due(kT0 + milliseconds(150)));
  EXPECT_FALSE(deadline.liveness_check_due(kT0 + milliseconds(199)));
  EXPECT_TRUE(deadline.liveness_check_due(kT0 + milliseconds(200)));
  EXPECT_TRUE(deadline.liveness_check_due(kT0 + milliseconds(450)));
  EXPECT_FALSE(deadline.liveness_check_due(kT0 + milliseconds(500)));
}

TEST(OpDeadline, LimitOnlyShortensAndStartsTheClockIfNeeded) {
  OpDeadline deadline(milliseconds(1000), milliseconds(100));
  deadline.begin_op();
  deadline.limit(kT0, milliseconds(2000));  // the op's own deadline comes first
  EXPECT_TRUE(deadline.started());
  EXPECT_FALSE(deadline.expired(kT0 + milliseconds(999)));
  EXPECT_TRUE(deadline.expired(kT0 + milliseconds(1000)));

  deadline.begin_op();
  (void)deadline.liveness_check_due(kT0);
  deadline.limit(kT0 + milliseconds(100), milliseconds(200));
  EXPECT_FALSE(deadline.expired(kT0 + milliseconds(299)));
  EXPECT_TRUE(deadline.expired(kT0 + milliseconds(300)));
}

TEST(PollBackoff, SpinsThenYieldsThenSleeps) {
  PollBackoff backoff(microseconds(300));
  EXPECT_EQ(backoff.step_at(kT0), PollBackoff::Step::kSpin);
  backoff.pause(kT0);  // the idle stretch starts here
  EXPECT_EQ(backoff.step_at(kT0 + microseconds(299)), PollBackoff::Step::kSpin);
  EXPECT_EQ(backoff.step_at(kT0 + microseconds(300)), PollBackoff::Step::kYield);
  EXPECT_EQ(backoff.step_at(kT0 + PollBackoff::kYieldFor - microseconds(1)),
            PollBackoff::Step::kYield);
  EXPECT_EQ(backoff.step_at(kT0 + PollBackoff::kYieldFor), PollBackoff::Step::kSleep);
  // A later empty poll does not move the stretch's start.
  backoff.pause(kT0 + microseconds(100));
  EXPECT_EQ(backoff.step_at(kT0 + microseconds(300)), PollBackoff::Step::kYield);
}

TEST(PollBackoff, ACompletionStartsANewIdleStretch) {
  PollBackoff backoff(microseconds(50));
  backoff.pause(kT0);
  ASSERT_EQ(backoff.step_at(kT0 + milliseconds(10)), PollBackoff::Step::kSleep);
  backoff.reset();
  EXPECT_EQ(backoff.step_at(kT0 + milliseconds(10)), PollBackoff::Step::kSpin);
  backoff.pause(kT0 + milliseconds(10));
  EXPECT_EQ(backoff.step_at(kT0 + milliseconds(10) + microseconds(49)), PollBackoff::Step::kSpin);
  EXPECT_EQ(backoff.step_at(kT0 + milliseconds(10) + microseconds(50)), PollBackoff::Step::kYield);
}

}  // namespace
}  // namespace ddp::detail::fabric
