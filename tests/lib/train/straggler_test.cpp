// Straggler reports (lib/src/train/straggler.cpp): the median, which ranks pass the threshold,
// the line that names one, and a window's figures shared across ranks.
#include "train/straggler.h"

#include <gtest/gtest.h>

#include <vector>

#include "thread_group.h"

namespace ddp::train::detail {
namespace {

TEST(Straggler, MedianOfOddAndEvenCounts) {
  EXPECT_EQ(median({}), 0.0);
  EXPECT_EQ(median({7.0}), 7.0);
  EXPECT_EQ(median({5.0, 1.0, 3.0}), 3.0);
  EXPECT_EQ(median({4.0, 1.0, 3.0, 10.0}), 3.5);  // the mean of the middle two
  EXPECT_EQ(median({2.0, 2.0, 2.0, 9.0, 9.0}), 2.0);
}

TEST(Straggler, NamesRanksAboveTheThresholdSlowestFirst) {
  // Median 40: rank 1 at 1.5x, rank 4 at 1.25x, rank 2 at exactly 1.2x (not above).
  const std::vector<double> compute{40, 60, 48, 38, 50, 40, 39};
  const auto found = find_stragglers(compute, 1.2);
  ASSERT_EQ(found.size(), 2u);
  EXPECT_EQ(found[0].rank, 1);
  EXPECT_DOUBLE_EQ(found[0].ratio, 1.5);
  EXPECT_EQ(found[0].compute_ms, 60.0);
  EXPECT_EQ(found[1].rank, 4);
  EXPECT_DOUBLE_EQ(found[1].ratio, 1.25);
  EXPECT_TRUE(find_stragglers(compute, 1.6).empty());
}

TEST(Straggler, BalancedOrIdleRanksAreNotNamed) {
  EXPECT_TRUE(find_stragglers({42, 43, 41, 42}, 1.2).empty());
  EXPECT_TRUE(find_stragglers({0, 0, 5}, 1.2).empty()) << "a median of 0 names no one";
  EXPECT_TRUE(find_stragglers({}, 1.2).empty());
}

TEST(Straggler, OneLineNamesRankNodeRatioAndWindow) {
  EXPECT_EQ(describe({3, 61.0, 61.0 / 42.0}, 1, 42.0, 200),
            "rank 3 (node 1) computes 1.45x slower than the median (61.0 vs 42.0 ms/step over "
            "200 steps)");
  EXPECT_EQ(describe({0, 30.0, 1.5}, -1, 20.0, 8),
            "rank 0 computes 1.50x slower than the median (30.0 vs 20.0 ms/step over 8 steps)");
}

TEST(StragglerMonitor, ReportsEveryWindowWithEachRanksMeans) {
  testing::ThreadGroup group(3);
  std::vector<StragglerReport> reports(3);
  std::vector<bool> due_early(3, true), due_after(3, false), due_again(3, true);
  const auto errors = group.run([&](Communicator& comm) {
    const int r = comm.rank();
    StragglerMonitor monitor(4, 1.2);
    // Rank r computes 10 (r + 1) ms and waits r ms per step; rank 2 also has one 40 ms step.
    for (int step = 0; step < 4; ++step) {
      if (step == 3) due_early[r] = monitor.due();
      const double compute = 0.010 * (r + 1) + (r == 2 && step == 0 ? 0.040 : 0.0);
      monitor.add_step(compute, 0.001 * r);
    }
    due_after[r] = monitor.due();
    reports[r] = monitor.share(comm);
    due_again[r] = monitor.due();
  });
  ASSERT_EQ(testing::failures(errors), "");
  for (int r = 0; r < 3; ++r) {
    EXPECT_FALSE(due_early[r]);
    EXPECT_TRUE(due_after[r]);
    EXPECT_FALSE(due_again[r]) << "share() starts the next window";
    const StragglerReport& report = reports[r];
    EXPECT_EQ(report.steps, 4);
    ASSERT_EQ(report.compute_ms.size(), 3u);
    EXPECT_NEAR(report.compute_ms[0], 10.0, 1e-9);
    EXPECT_NEAR(report.compute_ms[1], 20.0, 1e-9);
    EXPECT_NEAR(report.compute_ms[2], 40.0, 1e-9);  // (4 x 30 + 40) / 4
    EXPECT_NEAR(report.wait_ms[2], 2.0, 1e-9);
    EXPECT_NEAR(report.median_compute_ms, 20.0, 1e-9);
    ASSERT_EQ(report.stragglers.size(), 1u);
    EXPECT_EQ(report.stragglers[0].rank, 2);
    EXPECT_NEAR(report.stragglers[0].ratio, 2.0, 1e-9);
  }
}

TEST(StragglerMonitor, WindowZeroNeverReports) {
  StragglerMonitor monitor(0, 1.2);
  for (int i = 0; i < 1000; ++i) monitor.add_step(0.01, 0);
  EXPECT_FALSE(monitor.due());
}

}  // namespace
}  // namespace ddp::train::detail
