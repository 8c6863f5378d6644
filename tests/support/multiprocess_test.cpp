// The multi-process harness itself: a rank that hangs is killed at the deadline, and the failure
// says where it hung.
#include <unistd.h>

#include <chrono>
#include <string>

#include <gtest/gtest.h>

#include "multiprocess.h"

// Outside any namespace and never inlined, so that its name shows in the stack as written.
__attribute__((noinline)) void rank_hangs_here_for_the_harness_test() {
  for (;;) pause();
}

namespace ddp::testing {
namespace {

TEST(RunRanks, ARankStillRunningAtTheDeadlineIsKilledAndTheFailureShowsWhereItHung) {
  const auto outcomes = run_ranks(2, std::chrono::milliseconds(500), [](int rank) {
    if (rank == 1) rank_hangs_here_for_the_harness_test();
  });
  ASSERT_EQ(outcomes.size(), 2u);
  EXPECT_EQ(outcomes[0].exit_code, 0);
  EXPECT_FALSE(outcomes[0].killed_at_deadline);
  ASSERT_TRUE(outcomes[1].killed_at_deadline);
  EXPECT_EQ(outcomes[1].signal, SIGKILL);
  const std::string& stacks = outcomes[1].stacks_at_deadline;
  if (stacks.rfind("no stacks: gdb is not installed", 0) == 0 ||
      (stacks.rfind("no stacks: gdb could not attach", 0) == 0 &&
       stacks.find("ptrace") != std::string::npos)) {
    GTEST_SKIP() << "the hung rank was killed, but its stacks could not be checked: " << stacks;
  }
  EXPECT_NE(stacks.find("rank_hangs_here_for_the_harness_test"), std::string::npos) << stacks;
  EXPECT_NE(describe(outcomes[1]).find("rank_hangs_here_for_the_harness_test"), std::string::npos);
}

}  // namespace
}  // namespace ddp::testing
