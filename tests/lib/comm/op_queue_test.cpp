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
  for (auto& w : works) w.wait();
  ASSERT_EQ(order.size(), 20u);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(order[i], i);
  EXPECT_NE(ran_on, std::this_thread::get_id());
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
  queue.submit([&] { worker = static_cast<long>(::syscall(SYS_gettid)); }).wait();
  ASSERT_NE(worker, 0);
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
