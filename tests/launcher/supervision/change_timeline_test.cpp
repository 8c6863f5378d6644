// The change timeline's one line (supervision/change_timeline.h), from its times alone.
#include "supervision/change_timeline.h"

#include <gtest/gtest.h>

namespace ddprun {
namespace {

using namespace std::chrono_literals;

ChangeTimeline lost_node() {
  const auto t0 = ChangeTimeline::Clock::time_point() + 1000s;
  return ChangeTimeline("node 1 (train-1) was lost: no heartbeat for 15.0 s", t0, t0 + 1100ms);
}

TEST(ChangeTimeline, StatesEachPhaseFromDetection) {
  ChangeTimeline t = lost_node();
  t.agreed = t.detected + 1210ms;
  t.round = 2;
  t.nodes = 2;
  t.world_size = 4;
  t.started = t.detected + 1300ms;
  t.first_step = t.detected + 2414ms;
  EXPECT_EQ(t.line(),
            "membership change (node 1 (train-1) was lost: no heartbeat for 15.0 s): detected, "
            "workers stopped +1.10 s, agreed +1.21 s (round 2: 2 nodes, 4 ranks), workers "
            "started +1.30 s, first step +2.41 s");
}

TEST(ChangeTimeline, NamesARegroupInProcess) {
  ChangeTimeline t = lost_node();
  t.in_process = true;
  t.agreed = t.detected + 1150ms;
  t.round = 2;
  t.nodes = 2;
  t.world_size = 2;
  t.started = t.detected + 1160ms;
  t.first_step = t.detected + 1400ms;
  EXPECT_EQ(t.line(),
            "membership change (node 1 (train-1) was lost: no heartbeat for 15.0 s): detected, "
            "workers regrouped in-process +1.10 s, agreed +1.15 s (round 2: 2 nodes, 2 ranks), "
            "workers placed +1.16 s, first step +1.40 s");
}

TEST(ChangeTimeline, SaysWhatIsNotKnown) {
  ChangeTimeline t = lost_node();
  EXPECT_NE(t.line().find("workers stopped +1.10 s, no new round agreed"), std::string::npos)
      << t.line();
  t.agreed = t.detected + 2s;
  t.started = t.detected + 3s;
  EXPECT_EQ(t.line().find("first step"), std::string::npos) << t.line();
  EXPECT_NE(t.line(/*round_ended=*/true)
                .find("first step not reported (its workers write no live "
                      "metrics"),
            std::string::npos)
      << t.line(true);
}

}  // namespace
}  // namespace ddprun
