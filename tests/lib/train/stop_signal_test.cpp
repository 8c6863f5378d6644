// Unit test of lib/src/train/stop_signal.cpp: after install_stop_signal_handlers(), the first
// SIGTERM or SIGINT only sets the flag (and which signal it was), and the signal that arrived
// gets its default action back, so that a second one ends the process. The handlers and the flag
// are process-wide, so each case runs in a forked child (tests/support/multiprocess.h: a hard
// deadline, reaped by PID); raise() delivers the signal synchronously to the calling thread.
#include "ddp/train/stop_signal.h"

#include <gtest/gtest.h>

#include <chrono>
#include <csignal>
#include <stdexcept>
#include <string>

#include "multiprocess.h"

namespace ddp::train {
namespace {

using namespace std::chrono_literals;
using ddp::testing::require;

using Handler = void (*)(int);

// The disposition of `signal` right now: SIG_DFL, SIG_IGN or a handler.
Handler disposition(int signal) {
  struct sigaction current {};
  sigaction(signal, nullptr, &current);
  return current.sa_handler;
}

TEST(StopSignal, NothingIsRequestedBeforeASignal) {
  const auto outcomes = ddp::testing::run_ranks(1, 60s, [](int) {
    install_stop_signal_handlers();
    require(!stop_requested(), "a stop was requested without a signal");
    require(stop_signal_number() == 0, "a signal number without a signal");
    require(disposition(SIGTERM) != SIG_DFL && disposition(SIGTERM) != SIG_IGN,
            "no SIGTERM handler");
    require(disposition(SIGINT) != SIG_DFL && disposition(SIGINT) != SIG_IGN, "no SIGINT handler");
  });
  EXPECT_TRUE(ddp::testing::all_ranks_succeeded(outcomes));
}

TEST(StopSignal, SigtermSetsTheFlagAndRestoresTheDefaultAction) {
  const auto outcomes = ddp::testing::run_ranks(1, 60s, [](int) {
    install_stop_signal_handlers();
    std::raise(SIGTERM);  // handled: the process goes on
    require(stop_requested(), "SIGTERM did not request a stop");
    require(stop_signal_number() == SIGTERM,
            "signal number " + std::to_string(stop_signal_number()));
    require(disposition(SIGTERM) == SIG_DFL, "SIGTERM is still caught after the first one");
  });
  EXPECT_TRUE(ddp::testing::all_ranks_succeeded(outcomes));
}

TEST(StopSignal, SigintSetsTheFlagToo) {
  const auto outcomes = ddp::testing::run_ranks(1, 60s, [](int) {
    install_stop_signal_handlers();
    install_stop_signal_handlers();  // idempotent
    std::raise(SIGINT);
    require(stop_requested(), "SIGINT did not request a stop");
    require(stop_signal_number() == SIGINT,
            "signal number " + std::to_string(stop_signal_number()));
    require(disposition(SIGINT) == SIG_DFL, "SIGINT is still caught after the first one");
  });
  EXPECT_TRUE(ddp::testing::all_ranks_succeeded(outcomes));
}

TEST(StopSignal, ASecondSigtermEndsTheProcess) {
  const auto outcomes = ddp::testing::run_ranks(1, 60s, [](int) {
    install_stop_signal_handlers();
    std::raise(SIGTERM);
    require(stop_requested(), "the first SIGTERM did not request a stop");
    std::raise(SIGTERM);  // default action: the child dies here
    throw std::runtime_error("survived a second SIGTERM");
  });
  ASSERT_EQ(outcomes.size(), 1u);
  EXPECT_FALSE(outcomes[0].killed_at_deadline);
  EXPECT_EQ(outcomes[0].signal, SIGTERM) << ddp::testing::describe(outcomes[0]);
}

}  // namespace
}  // namespace ddp::train
