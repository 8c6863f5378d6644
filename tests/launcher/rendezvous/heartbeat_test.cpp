// Node liveness from heartbeat counters (launcher/rendezvous/heartbeat.h), on a clock the test moves by hand.
#include "rendezvous/heartbeat.h"

#include <gtest/gtest.h>

namespace ddprun {
namespace {

using namespace std::chrono_literals;
using Clock = HeartbeatMonitor::Clock;

TEST(Heartbeat, BeatsOncePerIntervalAndChecksFiveTimesAsOften) {
  const Clock::time_point t0 = Clock::now();
  HeartbeatMonitor h(3, 5s, 3, t0);
  EXPECT_TRUE(h.beat_due(t0));  // at once: the counter exists before the first check
  EXPECT_FALSE(h.beat_due(t0 + 4s));
  EXPECT_TRUE(h.beat_due(t0 + 5s));
  EXPECT_EQ(h.check_period(), 1s);
  EXPECT_FALSE(h.check_due(t0 + 900ms));
  EXPECT_TRUE(h.check_due(t0 + 1s));
  EXPECT_FALSE(h.check_due(t0 + 1500ms));
  EXPECT_TRUE(h.check_due(t0 + 2s));
  EXPECT_EQ(h.limit(), 15s);
}

// The verdict a collective failure waits for (supervisor.cpp): every other node stopped on
// purpose, or one is lost.
TEST(Heartbeat, KnowsWhenEveryOtherNodeStoppedOnPurpose) {
  const Clock::time_point t0 = Clock::now();
  HeartbeatMonitor h(3, 1s, 3, t0);
  EXPECT_FALSE(h.all_stopped_but(0));  // nothing observed yet
  const int64_t done = HeartbeatMonitor::kFinished + 4;
  EXPECT_TRUE(h.observe({4, 4, 4}, t0 + 1s).empty());
  EXPECT_FALSE(h.all_stopped_but(0));
  EXPECT_TRUE(h.observe({5, done, 5}, t0 + 2s).empty());
  EXPECT_FALSE(h.all_stopped_but(0));
  EXPECT_TRUE(h.observe({5, done, done}, t0 + 3s).empty());
  EXPECT_TRUE(h.all_stopped_but(0));
  EXPECT_FALSE(h.all_stopped_but(1));  // node 0 still beats
}

TEST(Heartbeat, ANodeWhoseCounterStopsIsLostAfterTheLimitOnce) {
  const Clock::time_point t0 = Clock::now();
  HeartbeatMonitor h(3, 5s, 3, t0);
  EXPECT_TRUE(h.observe({1, 1, 1}, t0 + 5s).empty());
  EXPECT_TRUE(h.observe({2, 2, 1}, t0 + 10s).empty());
  EXPECT_TRUE(h.observe({3, 3, 1}, t0 + 15s).empty());             // node 2 silent for 10 s
  EXPECT_EQ(h.observe({4, 4, 1}, t0 + 20s), std::vector<int>{2});  // 15 s: lost
  EXPECT_TRUE(h.observe({5, 5, 1}, t0 + 25s).empty());             // named once
}

TEST(Heartbeat, ANodeThatFinishedIsNeverLost) {
  const Clock::time_point t0 = Clock::now();
  HeartbeatMonitor h(2, 1s, 2, t0);
  const int64_t done = 7 + HeartbeatMonitor::kFinished;
  for (int s = 1; s <= 10; ++s) {
    EXPECT_TRUE(h.observe({s, done}, t0 + std::chrono::seconds(s)).empty()) << s;
  }
}

TEST(Heartbeat, ANodeThatNeverBeatsIsLostFromTheFirstLook) {
  const Clock::time_point t0 = Clock::now();
  HeartbeatMonitor h(2, 1s, 3, t0);
  EXPECT_TRUE(h.observe({1}, t0 + 1s).empty());  // node 1's counter missing: 0
  EXPECT_TRUE(h.observe({2}, t0 + 3s).empty());
  EXPECT_EQ(h.observe({3}, t0 + 4s), std::vector<int>{1});
}

}  // namespace
}  // namespace ddprun
