// The stuck-call guard abandons a call that spins (CPU time) or outlives its wall limit, and
// leaves alone a call that is merely slow to be scheduled. Each "call" below gives up on its own
// after kGiveUp, so a guard that fails to fire fails the test instead of hanging it.
#include "comm/fabric/stuck_call_guard.h"

#include <gtest/gtest.h>
#include <pthread.h>
#include <time.h>

#include <atomic>
#include <chrono>
#include <string>

namespace ddp::detail::fabric {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr auto kGiveUp = 20s;

// Burns CPU until `duration` has passed (or kGiveUp).
void spin_for(std::chrono::nanoseconds duration) {
  const auto end = Clock::now() + std::min<std::chrono::nanoseconds>(duration, kGiveUp);
  while (Clock::now() < end) {
  }
}

// Uses no CPU until `duration` has passed (or kGiveUp), like a call whose thread is descheduled.
void sleep_for(std::chrono::nanoseconds duration) {
  const auto end = Clock::now() + std::min<std::chrono::nanoseconds>(duration, kGiveUp);
  while (Clock::now() < end) {
    const timespec nap{0, 5'000'000};
    nanosleep(&nap, nullptr);
  }
}

std::chrono::milliseconds since(Clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
}

// `run` (a guarded call that never returns on its own) is abandoned no sooner than `limit`, well
// before the call would give up, for `reason`.
template <typename Run>
void expect_abandoned(const StuckCallGuard& guard, Run&& run, std::chrono::milliseconds limit,
                      const std::string& reason) {
  const auto start = Clock::now();
  EXPECT_FALSE(run());
  EXPECT_GE(since(start), limit);
  EXPECT_LT(since(start), 10s);
  EXPECT_EQ(guard.last_abandoned_reason(), reason);
}

TEST(StuckCallGuard, ACallThatSpinsIsAbandonedOnceItHasBurntItsCpuLimit) {
  StuckCallGuard guard(200ms, 60s);
  expect_abandoned(
      guard, [&] { return guard.run("call", [] { spin_for(kGiveUp); }); }, 200ms,
      "call spun for 200 ms of CPU time");
}

TEST(StuckCallGuard, ACallThatSpinsWhileTheLockHolderLivesIsLeftToItsWallLimit) {
  // Every peer alive: a call that burns its CPU limit may be busy, not stuck (tcp;ofi_rxm in a
  // loaded 3-rank barrier burnt a second). It is stuck once the holder is gone, or past its wall
  // limit.
  std::atomic<bool> holder_gone{false};
  StuckCallGuard guard(100ms, 60s, [&] { return holder_gone.load(); });
  EXPECT_TRUE(guard.run("fi_cq_read", [] { spin_for(600ms); }));
  expect_abandoned(
      guard,
      [&] {
        return guard.run("fi_cq_read", [&] {
          spin_for(400ms);
          holder_gone = true;
          spin_for(kGiveUp);
        });
      },
      400ms, "fi_cq_read spun for 100 ms of CPU time");
  holder_gone = false;
  expect_abandoned(
      guard,
      [&] {
        return guard.run(
            "fi_tsend", [] { spin_for(kGiveUp); }, 500ms);
      },
      500ms, "fi_tsend spun for 100 ms of CPU time");
}

TEST(StuckCallGuard, ACallThatUsesLittleCpuOutlivesTheCpuLimit) {
  // Over a second of wall time at almost no CPU: a call on an oversubscribed host.
  StuckCallGuard guard(100ms, 60s);
  EXPECT_TRUE(guard.run("call", [] { sleep_for(1200ms); }));
}

TEST(StuckCallGuard, ACallThatWaitsIsAbandonedAtItsWallLimit) {
  StuckCallGuard guard(60s, 300ms);
  expect_abandoned(
      guard, [&] { return guard.run("call", [] { sleep_for(kGiveUp); }); }, 300ms,
      "call ran for 300 ms");
}

TEST(StuckCallGuard, ACallThatComputesPastItsWallLimitIsLeftToTheCpuLimit) {
  // Runnable all along (as a call waiting for a core on a busy host is): jumping out could
  // leave a lock of libc's held. Twice the wall limit at a tenth of the CPU limit.
  StuckCallGuard guard(6s, 300ms);
  EXPECT_TRUE(guard.run("call", [] { spin_for(600ms); }));
  // The same thread asleep in the kernel past the limit is abandoned.
  expect_abandoned(
      guard, [&] { return guard.run("call", [] { sleep_for(kGiveUp); }); }, 300ms,
      "call ran for 300 ms");
}

TEST(StuckCallGuard, CpuTimeCountsPerCallNotAcrossCalls) {
  // 600 calls of 2 ms each burn 1.2 s in all, six times the limit, but none comes near it; nor
  // does a longer call after them, which the watchdog sees more than once.
  StuckCallGuard guard(200ms, 60s);
  int completed = 0;
  for (int i = 0; i < 600; ++i) completed += guard.run("call", [] { spin_for(2ms); }) ? 1 : 0;
  EXPECT_EQ(completed, 600);
  EXPECT_TRUE(guard.run("call", [] { spin_for(150ms); }));
}

TEST(StuckCallGuard, TheGuardStillWorksAfterAnAbandonedCall) {
  StuckCallGuard guard(100ms, 60s);
  EXPECT_FALSE(guard.run("call", [] { spin_for(kGiveUp); }));
  EXPECT_TRUE(guard.run("call", [] { spin_for(1ms); }));
  EXPECT_FALSE(guard.run("call", [] { spin_for(kGiveUp); }));
}

TEST(StuckCallGuard, AnEscapeSignalMeantForAnEarlierCallLeavesTheCurrentOneAlone) {
  // The watchdog signals the call it judged stuck; if that call returns before the signal lands,
  // the signal may reach the thread inside its next call, which must go on.
  StuckCallGuard guard(60s, 60s);
  EXPECT_TRUE(guard.run("call", [] {
    pthread_kill(pthread_self(), StuckCallGuard::escape_signal());
    spin_for(10ms);
  }));
}

TEST(StuckCallGuard, ACallWithAWallLimitOfItsOwnIsAbandonedAtThatLimit) {
  // Best-effort calls on a failure path give up long before the op's timeout.
  StuckCallGuard guard(60s, 60s);
  expect_abandoned(
      guard,
      [&] {
        return guard.run(
            "call", [] { sleep_for(kGiveUp); }, 300ms);
      },
      300ms, "call ran for 300 ms");
  // The next call is back under the guard's own limits.
  EXPECT_TRUE(guard.run("call", [] { sleep_for(700ms); }));
}

}  // namespace
}  // namespace ddp::detail::fabric
