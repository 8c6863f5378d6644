#include "comm/op_queue.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "ddp/error.h"

namespace ddp::detail {
namespace {

using namespace std::chrono_literals;

TEST(OpQueue, RunsInlineOnTheCallerWhenIdle) {
  OpQueue queue;
  std::thread::id ran_on;
  queue.run([&] { ran_on = std::this_thread::get_id(); });
  EXPECT_EQ(ran_on, std::this_thread::get_id());
}

TEST(OpQueue, AsyncOpsRunInIssueOrderOffTheCaller) {
  OpQueue queue;
  std::vector<int> order;
  std::vector<Work> works;
  std::thread::id ran_on;
  for (int i = 0; i < 20; ++i) {
    works.push_back(queue.submit([&, i] {
      ran_on = std::this_thread::get_id();
      order.push_back(i);
    }));
  }
  // Polled, not waited on: a wait may run an op the worker has not started on the waiter.
  for (auto& w : works) {
    while (!w.completed()) std::this_thread::sleep_for(100us);
  }
  ASSERT_EQ(order.size(), 20u);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(order[i], i);
  EXPECT_NE(ran_on, std::this_thread::get_id());
}

TEST(OpQueue, AWaitRunsTheOpsTheWorkerHasNotStartedOnTheWaiter) {
  OpQueue queue(WorkerStart::kManual);  // the worker is not scheduled yet
  std::vector<int> order;
  std::vector<std::thread::id> ran_on;
  auto op = [&](int i) {
    return [&, i] {
      order.push_back(i);
      ran_on.push_back(std::this_thread::get_id());
    };
  };
  Work first = queue.submit(op(1));
  Work second = queue.submit(op(2));
  Work third = queue.submit(op(3));
  second.wait();  // runs what is ahead of it, in order, then itself; not what comes after
  EXPECT_TRUE(first.completed());
  EXPECT_FALSE(third.completed());
  ASSERT_EQ(order, (std::vector<int>{1, 2}));
  for (auto id : ran_on) EXPECT_EQ(id, std::this_thread::get_id());
  queue.start_worker();
  while (!third.completed()) std::this_thread::sleep_for(100us);
  ASSERT_EQ(order, (std::vector<int>{1, 2, 3}));
  EXPECT_NE(ran_on.back(), std::this_thread::get_id());
}

TEST(OpQueue, AnErrorOfAnOpRunOnItsWaiterReachesTheWaiter) {
  OpQueue queue(WorkerStart::kManual);
  Work failing = queue.submit([] { throw CommError("allreduce", 0, 1, "boom"); });
  int ran = 0;
  Work after = queue.submit([&] { ran = 1; });
  EXPECT_NO_THROW(after.wait());  // ran both on this thread: the error stays with its op
  EXPECT_EQ(ran, 1);
  EXPECT_TRUE(failing.completed());
  EXPECT_THROW(failing.wait(), CommError);
}

TEST(OpQueue, BlockingCallWaitsBehindQueuedOps) {
  OpQueue queue;
  std::vector<int> order;
  std::atomic<bool> release{false};
  Work first = queue.submit([&] {
    while (!release) std::this_thread::sleep_for(1ms);
    order.push_back(1);
  });
  std::thread releaser([&] {
    std::this_thread::sleep_for(20ms);
    release = true;
  });
  queue.run([&] { order.push_back(2); });
  releaser.join();
  first.wait();
  EXPECT_EQ(order, (std::vector<int>{1, 2}));
}

TEST(OpQueue, ErrorsReachTheWaiter) {
  OpQueue queue;
  Work w = queue.submit([] { throw CommError("allreduce", 0, 1, "boom"); });
  EXPECT_THROW(w.wait(), CommError);
  EXPECT_TRUE(w.completed());
  EXPECT_THROW(queue.run([] { throw std::runtime_error("inline"); }), std::runtime_error);
  // The queue stays usable after failures.
  int ran = 0;
  queue.submit([&] { ran = 1; }).wait();
  EXPECT_EQ(ran, 1);
}

TEST(OpQueue, StopFailsOpsThatNeverStarted) {
  OpQueue queue;
  std::atomic<bool> started{false};
  std::atomic<bool> release{false};
  Work running = queue.submit([&] {
    started = true;
    while (!release) std::this_thread::sleep_for(1ms);
  });
  Work pending = queue.submit([] {});
  // stop() must come after the comm thread took `running`, or `running` never starts either.
  while (!started) std::this_thread::sleep_for(1ms);
  std::thread stopper([&] { queue.stop(); });
  std::this_thread::sleep_for(20ms);
  release = true;
  stopper.join();
  EXPECT_NO_THROW(running.wait());
  EXPECT_THROW(pending.wait(), Error);
  EXPECT_THROW(queue.run([] {}), Error);
}

// Context switches of one thread of this process, from /proc.
long context_switches(long tid) {
  std::ifstream status("/proc/self/task/" + std::to_string(tid) + "/status");
  long total = 0;
  for (std::string line; std::getline(status, line);) {
    for (const char* key : {"voluntary_ctxt_switches:", "nonvoluntary_ctxt_switches:"}) {
      if (line.rfind(key, 0) == 0) total += std::stol(line.substr(std::string(key).size()));
    }
  }
  return total;
}

TEST(OpQueue, InlineOpsLeaveTheIdleWorkerAsleep) {
  OpQueue queue;
  long worker = 0;
  // Polled, not waited on: a wait would run it on this thread.
  Work first = queue.submit([&] { worker = static_cast<long>(::syscall(SYS_gettid)); });
  while (!first.completed()) std::this_thread::sleep_for(100us);
  ASSERT_NE(worker, 0);
  ASSERT_NE(worker, static_cast<long>(::syscall(SYS_gettid)));
  std::this_thread::sleep_for(10ms);  // the worker is back to waiting for work
  const long before = context_switches(worker);
  // Spaced out as a training step spaces its collectives, so that a woken worker would be back
  // to waiting before the next op.
  constexpr int kOps = 200;
  int ran = 0;
  for (int i = 0; i < kOps; ++i) {
    queue.run([&] { ++ran; });
    std::this_thread::sleep_for(200us);
  }
  const long woken = context_switches(worker) - before;
  EXPECT_EQ(ran, kOps);
  // Waking it after each inline op would switch it in and out at least kOps times.
  EXPECT_LT(woken, kOps / 20) << "the idle worker was woken " << woken << " times by " << kOps
                              << " inline ops";
}

TEST(OpQueue, StopWaitsForAnInlineOpInFlight) {
  OpQueue queue;
  std::atomic<bool> started{false};
  std::atomic<bool> finished{false};
  std::thread caller([&] {
    queue.run([&] {
      started = true;
      std::this_thread::sleep_for(30ms);
      finished = true;
    });
  });
  while (!started) std::this_thread::sleep_for(1ms);
  std::atomic<bool> stopped{false};
  std::thread stopper([&] {
    queue.stop();
    stopped = true;
  });
  const auto give_up = std::chrono::steady_clock::now() + 5s;
  while (!stopped && std::chrono::steady_clock::now() < give_up) std::this_thread::sleep_for(1ms);
  if (!stopped) {
    // stop() never learnt that the inline op ended; the queue cannot be destroyed either.
    std::fprintf(stderr, "OpQueue::stop() still waits 5 s after the inline op ended\n");
    std::_Exit(1);
  }
  EXPECT_TRUE(finished);
  caller.join();
  stopper.join();
  EXPECT_THROW(queue.run([] {}), Error);
}

TEST(Work, DefaultConstructedIsComplete) {
  Work w;
  EXPECT_TRUE(w.completed());
  EXPECT_NO_THROW(w.wait());
}

}  // namespace
}  // namespace ddp::detail
