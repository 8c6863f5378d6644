#include "hang_diagnosis.h"

#include <gtest/gtest.h>

#include "ddp/error.h"

namespace ddprun {
namespace {

HangOp op(unsigned long long seq, double seconds, int waiting_on = -1) {
  return {seq, "allreduce", "allreduce #" + std::to_string(seq) + " (bucket 0, 4.0 KiB float32)",
          seconds, waiting_on};
}

WorkerHangState waiting(int rank, unsigned long long seq, double seconds, int on = -1) {
  WorkerHangState w;
  w.rank = rank;
  w.local_rank = rank % 2;
  w.pid = 1000 + rank;
  w.process_state = "running";
  w.has_recorder = true;
  w.running = op(seq, seconds, on);
  w.last_finished = op(seq - 1, seconds + 0.01);
  return w;
}

WorkerHangState idle(int rank, unsigned long long last, double ago, std::string state) {
  WorkerHangState w;
  w.rank = rank;
  w.local_rank = rank % 2;
  w.pid = 1000 + rank;
  w.process_state = std::move(state);
  w.has_recorder = true;
  w.last_finished = op(last, ago);
  return w;
}

NodeHangReport node(int n, std::vector<WorkerHangState> workers) {
  return {n, "train-" + std::to_string(n), std::move(workers)};
}

TEST(HangDiagnosis, NamesTheRankThatHasNotEnteredTheOp) {
  auto culprit = idle(3, 11, 7.5, "stopped (SIGSTOP)");
  culprit.stack = "TID 1003:\n#0 0x1 raise\n#1 0x2 main";
  const auto d = diagnose_hang({node(0, {waiting(0, 12, 7.2, 3), waiting(1, 12, 7.1, 0)}),
                                node(1, {waiting(2, 12, 7.3, 3), culprit})},
                               2);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->culprits, std::vector<int>{3});
  EXPECT_EQ(d->headline,
            "rank 3 (node 1, train-1) has not entered allreduce #12 (bucket 0, 4.0 KiB float32); "
            "ranks 0-2 wait in it for 7.3 s");
  const std::string& t = d->text;
  EXPECT_NE(t.find("rank 3 (node 1, train-1), pid 1003, is stopped (SIGSTOP); it last finished "
                   "allreduce #11 (bucket 0, 4.0 KiB float32) 7.5 s ago"),
            std::string::npos)
      << t;
  EXPECT_NE(t.find("  its stack:\n    TID 1003:\n    #0 0x1 raise\n    #1 0x2 main\n"),
            std::string::npos)
      << t;
  EXPECT_NE(t.find("waiting on: 0->3, 1->0, 2->3"), std::string::npos) << t;
}

TEST(HangDiagnosis, ARankStillInAnOlderOpIsACulpritToo) {
  auto behind = waiting(1, 40, 9.0);
  const auto d = diagnose_hang({node(0, {waiting(0, 41, 4.0), behind})}, 1);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->culprits, std::vector<int>{1});
  EXPECT_NE(d->text.find("it waits in allreduce #40 (bucket 0, 4.0 KiB float32) for 9.0 s"),
            std::string::npos)
      << d->text;
}

TEST(HangDiagnosis, EveryRankInTheOpPointsAtTheLink) {
  const auto d = diagnose_hang({node(0, {waiting(0, 5, 70, 1), waiting(1, 5, 71, 0)})}, 1);
  ASSERT_TRUE(d);
  EXPECT_TRUE(d->culprits.empty());
  EXPECT_EQ(d->headline,
            "every rank waits in allreduce #5 (bucket 0, 4.0 KiB float32) for 71.0 s: none is "
            "missing from it, so a link or a peer's transport is stuck");
}

TEST(HangDiagnosis, ANodeWithoutAReportIsNamed) {
  const auto d = diagnose_hang({node(0, {waiting(0, 5, 20), waiting(1, 5, 20)})}, 3);
  ASSERT_TRUE(d);
  EXPECT_NE(d->headline.find("nodes 1-2 sent no report"), std::string::npos) << d->headline;
}

TEST(HangDiagnosis, WorkersWithoutARecorderAreTheLikelyCause) {
  WorkerHangState python;
  python.rank = 1;
  python.process_state = "sleeping";
  python.recorder_note = "no flight recorder";
  const auto d = diagnose_hang({node(0, {waiting(0, 5, 20), python})}, 1);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->culprits, std::vector<int>{1});
  EXPECT_NE(d->headline.find("rank 1 keeps no flight recorder"), std::string::npos) << d->headline;
}

TEST(HangDiagnosis, NothingWhenNoRankWaitsAnyMore) {
  EXPECT_FALSE(diagnose_hang({node(0, {idle(0, 5, 1, "running"), idle(1, 5, 1, "running")})}, 1));
}

TEST(HangDiagnosis, SeveralCulpritsAreAllNamed) {
  const auto d = diagnose_hang({node(0, {waiting(0, 9, 5), idle(1, 8, 5, "sleeping"),
                                         idle(2, 8, 5, "sleeping"), idle(3, 8, 5, "sleeping")})},
                               1);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->culprits, (std::vector<int>{1, 2, 3}));
  EXPECT_NE(d->headline.find("; nor have ranks 2-3"), std::string::npos) << d->headline;
}

TEST(HangDiagnosis, LocalSuspicion) {
  EXPECT_TRUE(locally_suspect(idle(0, 3, 1, "sleeping"), 3));           // in no collective
  EXPECT_TRUE(locally_suspect(waiting(0, 3, 1.0), 3));                  // entered it recently
  EXPECT_FALSE(locally_suspect(waiting(0, 3, 5.0), 3));                 // waits like the others
  EXPECT_TRUE(locally_suspect(idle(0, 3, 1, "stopped (SIGSTOP)"), 3));  // stopped
}

TEST(HangDiagnosis, ReportsRoundTripThroughJson) {
  auto w = idle(3, 11, 7.5, "sleeping");
  w.stack = "#0 main";
  const NodeHangReport r = node(1, {waiting(2, 12, 7.3, 3), w});
  const NodeHangReport back = NodeHangReport::from_json(r.to_json());
  EXPECT_EQ(back.to_json(), r.to_json());
  EXPECT_EQ(back.workers[1].stack, "#0 main");
  EXPECT_FALSE(back.workers[1].running);
  EXPECT_THROW(NodeHangReport::from_json("{\"node\": 1}"), ddp::Error);
}

TEST(HangDiagnosis, RankRanges) {
  EXPECT_EQ(rank_ranges({7, 0, 2, 3, 4}), "0, 2-4, 7");
  EXPECT_EQ(rank_ranges({5}), "5");
  EXPECT_EQ(rank_ranges({}), "");
}

}  // namespace
}  // namespace ddprun
