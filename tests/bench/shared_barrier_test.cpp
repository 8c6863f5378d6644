// The benchmark's cross-process barrier: in every round no rank leaves before the last one
// arrived, with the ranks arriving in a different order each round.
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <random>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "shared_barrier.h"

namespace {

constexpr int kRanks = 3;
constexpr int kRounds = 30;

struct Times {
  std::int64_t arrived[kRounds][kRanks];
  std::int64_t left[kRounds][kRanks];
};

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void run_rank(ddp::bench::SharedBarrier barrier, Times* times, int rank) {
  std::mt19937 random(static_cast<unsigned>(rank) + 1);
  std::uniform_int_distribution<int> delay_us(0, 2000);
  for (int round = 0; round < kRounds; ++round) {
    std::this_thread::sleep_for(std::chrono::microseconds(delay_us(random)));
    times->arrived[round][rank] = now_ns();
    barrier.arrive_and_wait();
    times->left[round][rank] = now_ns();
  }
}

TEST(SharedBarrier, NoRankLeavesBeforeTheLastArrived) {
  auto barrier = ddp::bench::SharedBarrier::create(kRanks);
  void* shared =
      mmap(nullptr, sizeof(Times), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(shared, MAP_FAILED);
  auto* times = new (shared) Times{};
  std::vector<pid_t> children;
  for (int rank = 1; rank < kRanks; ++rank) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      alarm(60);  // a barrier that never opens ends every rank within a minute
      run_rank(barrier, times, rank);
      _exit(0);
    }
    children.push_back(pid);
  }
  alarm(60);  // this process too: the test fails (SIGALRM) instead of hanging ctest
  run_rank(barrier, times, 0);
  alarm(0);
  for (pid_t pid : children) {
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "a rank failed, pid " << pid;
  }
  for (int round = 0; round < kRounds; ++round) {
    std::int64_t last_arrival = 0;
    for (int rank = 0; rank < kRanks; ++rank) {
      last_arrival = std::max(last_arrival, times->arrived[round][rank]);
    }
    for (int rank = 0; rank < kRanks; ++rank) {
      EXPECT_GE(times->left[round][rank], last_arrival) << "round " << round << ", rank " << rank;
    }
  }
  munmap(shared, sizeof(Times));
}

}  // namespace
