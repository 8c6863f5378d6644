#include "diagnosis/hang_diagnosis.h"

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

// eu-stack's text for two torch 1.13 gloo workers (trimmed): rank 0 waits in all_reduce, rank 1
// sleeps in Python.
const char* kWaitingStack =
    "PID 11665 - process\n"
    "TID 11665:\n"
    "#0  0x00007f5f836a6f16 __futex_abstimed_wait_common\n"
    "#1  0x00007f5f836a95d8 pthread_cond_wait@@GLIBC_2.3.2\n"
    "#2  0x00007f5f7f2c2843 c10d::Work::wait(std::chrono::duration<long, std::ratio<1l, 1000l> "
    ">)\n"
    "#3  0x000000000052b9e0 _PyEval_EvalFrameDefault\n"
    "TID 11672:\n"
    "#0  0x00007f5f78fd8d6b gloo::transport::tcp::UnboundBuffer::waitRecv(int*, "
    "std::chrono::duration<long, std::ratio<1l, 1000l> >)\n"
    "#1  0x00007f5f7f26c8ad c10d::ProcessGroupGloo::AsyncWork::execute(...)\n";
const char* kSleepingStack =
    "PID 11666 - process\n"
    "TID 11666:\n"
    "#0  0x00007f290883f545 clock_nanosleep@GLIBC_2.2.5\n"
    "#1  0x000000000053acbc PyObject_Vectorcall\n"
    "TID 11673:\n"
    "#0  0x00007f29087f85d8 pthread_cond_wait@@GLIBC_2.3.2\n"
    "#1  0x00007f290426cac1 c10d::ProcessGroupGloo::runLoop(int)\n";

TEST(HangDiagnosis, TheMainThreadsStackTellsWhereAC10dWorkerIs) {
  EXPECT_EQ(c10d_wait_of(kWaitingStack, 11665), "collective");
  // Its gloo threads wait too, but the main thread is in Python's sleep.
  EXPECT_EQ(c10d_wait_of(kSleepingStack, 11666), "none");
  EXPECT_EQ(
      c10d_wait_of("TID 7:\n#0 0x1 c10d::TCPStore::doWait(...)\n#1 0x2 c10d::TCPStore::get\n", 7),
      "store");
  // gdb names the main thread by its LWP.
  EXPECT_EQ(c10d_wait_of("Thread 2 (Thread 0x7f (LWP 8) \"python3\"):\n#0 c10d::Work::wait()\n"
                         "Thread 1 (Thread 0x7e (LWP 7) \"python3\"):\n#0 clock_nanosleep\n",
                         7),
            "none");
  EXPECT_EQ(c10d_wait_of(kWaitingStack, 4242), "");  // not this process's stack
  EXPECT_EQ(c10d_wait_of("", 1), "");
}

WorkerHangState python(int rank, const std::string& where, double idle_seconds,
                       std::string state = "sleeping") {
  WorkerHangState w;
  w.rank = rank;
  w.local_rank = rank % 2;
  w.pid = 2000 + rank;
  w.process_state = std::move(state);
  w.recorder_note = "no flight recorder";
  w.c10d_wait = where;
  w.idle_seconds = idle_seconds;
  if (!where.empty()) w.stack = "TID " + std::to_string(w.pid) + ":\n#0 0x1 clock_nanosleep\n";
  return w;
}

TEST(HangDiagnosis, PythonWorkersAreDiagnosedFromTheirStacks) {
  const auto d =
      diagnose_hang({node(0, {python(0, "collective", 4.2), python(1, "collective", 4.0)}),
                     node(1, {python(2, "collective", 3.9), python(3, "none", 5.5)})},
                    2, "SIGUSR1");
  ASSERT_TRUE(d);
  EXPECT_EQ(d->culprits, std::vector<int>{3});
  EXPECT_EQ(d->headline,
            "rank 3 (node 1, train-1) has not entered a torch.distributed collective; ranks 0-2 "
            "wait in it for 4.2 s");
  EXPECT_NE(d->text.find("rank 3 (node 1, train-1), pid 2003, is sleeping; its main thread has "
                         "neither run nor woken up for 5.5 s, in no torch.distributed call\n"
                         "  its stack:\n    TID 2003:\n    #0 0x1 clock_nanosleep\n"
                         "  its Python stack follows in its output, where the script registered "
                         "faulthandler on SIGUSR1\n"),
            std::string::npos)
      << d->text;
}

TEST(HangDiagnosis, AStoppedPythonWorkerIsNamedAndStoreWaitersAreSaidSo) {
  const auto d =
      diagnose_hang({node(0, {python(0, "store", 9), python(1, "", 9, "stopped (SIGSTOP)")})}, 1);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->culprits, std::vector<int>{1});
  EXPECT_EQ(d->headline,
            "rank 1 (node 0, train-0) has not entered the rendezvous store (init_process_group or "
            "a store-based barrier); rank 0 waits in it for 9.0 s");
  EXPECT_NE(d->text.find("register faulthandler on a signal and set DDP_PY_STACK_SIGNAL"),
            std::string::npos)
      << d->text;
}

TEST(HangDiagnosis, PythonWorkersAllInACollectivePointAtMismatchOrTheLink) {
  const auto d =
      diagnose_hang({node(0, {python(0, "collective", 9), python(1, "collective", 8)})}, 1);
  ASSERT_TRUE(d);
  EXPECT_TRUE(d->culprits.empty());
  EXPECT_EQ(d->headline,
            "every rank waits in a torch.distributed collective for 9.0 s: none is missing from "
            "it, so they wait in different collectives, or a link or a peer's transport is stuck");
  // Unread ones (no stack) are the likely cause; none waiting: nothing to say.
  EXPECT_EQ(diagnose_hang({node(0, {python(0, "collective", 9), python(1, "", 9)})}, 1)->culprits,
            std::vector<int>{1});
  EXPECT_FALSE(diagnose_hang({node(0, {python(0, "none", 9), python(1, "", 9)})}, 1));
}

TEST(HangDiagnosis, RankRanges) {
  EXPECT_EQ(rank_ranges({7, 0, 2, 3, 4}), "0, 2-4, 7");
  EXPECT_EQ(rank_ranges({5}), "5");
  EXPECT_EQ(rank_ranges({}), "");
}

}  // namespace
}  // namespace ddprun
