#include "comm/op_queue.h"

#include <atomic>
#include <chrono>
#include <stdexcept>
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

TEST(Work, DefaultConstructedIsComplete) {
  Work w;
  EXPECT_TRUE(w.completed());
  EXPECT_NO_THROW(w.wait());
}

}  // namespace
}  // namespace ddp::detail
