// The supervisor's round state machine (launcher/supervision/round_state.h): one test per
// transition, on a clock the test moves by hand.
#include "supervision/round_state.h"

#include <csignal>

#include <gtest/gtest.h>

#include "ddp/exit_codes.h"

namespace ddprun {
namespace {

using namespace std::chrono_literals;
using Clock = RoundStateMachine::Clock;

constexpr auto kShutdown = 30s;
constexpr auto kMonitor = 100ms;

struct Round : ::testing::Test {
  Clock::time_point t0 = Clock::now();
  RoundStateMachine round{{kShutdown, kMonitor}, t0};
};

FailureReport worker_failure(int rank, int node, int exit_code = 1) {
  FailureReport r;
  r.rank = rank;
  r.node_rank = node;
  r.exit_code = exit_code;
  r.message = "boom";
  return r;
}

// A collective failure: most likely the echo of a peer that is slower to exit.
FailureReport consequence(int rank, int node) {
  FailureReport r = worker_failure(rank, node, ddp::exit_code::kComm);
  r.message = "CommError: rank 3 closed the connection";
  return r;
}

FailureReport agent_record(int node, int signal) {
  FailureReport r;
  r.kind = "agent";
  r.node_rank = node;
  r.signal = signal;
  r.exit_code = 128 + signal;
  r.message = "the node was asked to stop";
  return r;
}

TEST_F(Round, StartsRunningAndWaitsForTheMonitor) {
  EXPECT_FALSE(round.outcome().stop_began);
  EXPECT_EQ(round.state(), RoundState::kRunning);
  EXPECT_EQ(round.tick(t0 + 1h), RoundAction::kNone);
  EXPECT_EQ(round.next_wake(), t0 + kMonitor);
  EXPECT_EQ(round.outcome().kind, RoundOutcome::Kind::kSucceeded);
}

TEST_F(Round, AWorkerFailureStopsAtOnceWithSigterm) {
  ASSERT_TRUE(round.reports_worker_failures());
  round.worker_failed(worker_failure(1, 0), t0);
  EXPECT_EQ(round.state(), RoundState::kStopPending);
  EXPECT_EQ(round.outcome().kind, RoundOutcome::Kind::kFailed);
  EXPECT_EQ(round.outcome().root_cause->rank, 1);
  EXPECT_EQ(round.next_wake(), t0);
  EXPECT_EQ(round.tick(t0), RoundAction::kSignalWorkers);
  EXPECT_EQ(round.stop_signal(), SIGTERM);
  EXPECT_EQ(round.state(), RoundState::kSignalled);
}

TEST_F(Round, ACollectiveFailureGivesTheRealCauseTwoSecondsToShow) {
  ASSERT_TRUE(consequence(1, 0).is_consequence());
  round.worker_failed(consequence(1, 0), t0);
  EXPECT_EQ(round.state(), RoundState::kStopPending);
  EXPECT_EQ(round.tick(t0 + 1999ms), RoundAction::kNone);
  // The real cause, slower to exit, is still reported and brings the signal forward.
  ASSERT_TRUE(round.reports_worker_failures());
  round.worker_failed(worker_failure(3, 0, 7), t0 + 500ms);
  EXPECT_EQ(round.outcome().root_cause->rank, 3);
  EXPECT_EQ(round.tick(t0 + 500ms), RoundAction::kSignalWorkers);
}

TEST_F(Round, TheGraceNeverExceedsTheShutdownTimeout) {
  RoundStateMachine quick({500ms, kMonitor}, t0);
  quick.worker_failed(consequence(1, 0), t0);
  EXPECT_EQ(quick.tick(t0 + 499ms), RoundAction::kNone);
  EXPECT_EQ(quick.tick(t0 + 500ms), RoundAction::kSignalWorkers);
}

TEST_F(Round, SigkillFollowsAfterTheShutdownTimeout) {
  round.worker_failed(worker_failure(1, 0), t0);
  ASSERT_EQ(round.tick(t0), RoundAction::kSignalWorkers);
  EXPECT_EQ(round.next_wake(), t0 + kMonitor) << "the monitor comes first";
  EXPECT_EQ(round.tick(t0 + kShutdown - 1ms), RoundAction::kNone);
  EXPECT_EQ(round.tick(t0 + kShutdown), RoundAction::kKillWorkers);
  EXPECT_EQ(round.state(), RoundState::kKilled);
  EXPECT_EQ(round.tick(t0 + 2 * kShutdown), RoundAction::kNone);
}

TEST_F(Round, ALostNodeLetsTheWorkersAbortThenKillsTwoSecondsAfterTheSignal) {
  // The workers were told (DDP_ABORT_FILE) and get the consequence grace to give up their
  // collectives themselves; those still blocked get the stop signal, and SIGKILL 2 s later
  // rather than after the shutdown timeout: they cannot finish a step.
  FailureReport lost;
  lost.kind = "lost";
  lost.node_rank = 1;
  lost.exit_code = ddp::exit_code::kComm;
  round.other_node_failed(lost, t0);
  EXPECT_EQ(round.tick(t0), RoundAction::kNone);
  ASSERT_EQ(round.tick(t0 + 2s), RoundAction::kSignalWorkers);
  EXPECT_EQ(round.stop_signal(), SIGTERM);
  EXPECT_EQ(round.tick(t0 + 4s - 1ms), RoundAction::kNone);
  EXPECT_EQ(round.tick(t0 + 4s), RoundAction::kKillWorkers);
  EXPECT_EQ(round.outcome().root_cause->headline().rfind("node 1 (", 0), 0u);
}

TEST_F(Round, AZeroShutdownTimeoutKillsAtOnce) {
  RoundStateMachine hard({0ms, kMonitor}, t0);
  hard.worker_failed(worker_failure(1, 0), t0);
  EXPECT_EQ(hard.tick(t0), RoundAction::kSignalWorkers);
  EXPECT_EQ(hard.stop_signal(), SIGKILL);
  EXPECT_EQ(hard.state(), RoundState::kKilled);
}

TEST_F(Round, ExitsAfterTheStopSignalAreConsequences) {
  round.worker_failed(worker_failure(1, 0), t0);
  EXPECT_TRUE(round.reports_worker_failures()) << "before the signal, exits still count";
  round.tick(t0);
  EXPECT_FALSE(round.reports_worker_failures());
}

TEST_F(Round, ASignalToDdprunForwardsItAtOnceAndKeepsItsRecord) {
  const FailureReport mine = agent_record(0, SIGTERM);
  round.agent_signalled(SIGTERM, mine, mine, t0);
  EXPECT_EQ(round.outcome().kind, RoundOutcome::Kind::kInterrupted);
  EXPECT_FALSE(round.reports_worker_failures()) << "the workers' exits answer the signal";
  EXPECT_EQ(round.tick(t0), RoundAction::kSignalWorkers);
  EXPECT_EQ(round.stop_signal(), SIGTERM);
  EXPECT_TRUE(round.signal_kills_now());
  EXPECT_EQ(round.signalled_again(), RoundAction::kKillWorkers);
  EXPECT_EQ(round.state(), RoundState::kKilled);
}

TEST_F(Round, SettlingTakesTheWorkersAnswerAndRevisesTheOwnRecord) {
  const FailureReport mine = agent_record(0, SIGTERM);
  round.agent_signalled(SIGTERM, mine, mine, t0);
  const auto revision = round.settle({{0, 0}, {75, 0}});
  EXPECT_EQ(round.outcome().exit_code, 75);
  ASSERT_TRUE(revision);
  EXPECT_EQ(revision->first.to_json(), mine.to_json());
  EXPECT_EQ(revision->second.exit_code, 75);
  EXPECT_NE(revision->second.message.find("its workers exited with code 75"), std::string::npos);
}

TEST_F(Round, SettlingKeepsTheSignalsCodeWhenTheWorkersWereKilled) {
  const FailureReport mine = agent_record(0, SIGINT);
  round.agent_signalled(SIGINT, mine, mine, t0);
  EXPECT_FALSE(round.settle({{128 + SIGINT, SIGINT}}));
  EXPECT_EQ(round.outcome().exit_code, 128 + SIGINT);
}

TEST_F(Round, AnotherNodesAgentRecordIsNotRevisedHere) {
  const FailureReport theirs = agent_record(1, SIGTERM);
  round.agent_signalled(SIGTERM, agent_record(0, SIGTERM), theirs, t0);
  EXPECT_FALSE(round.settle({{75, 0}}));
  EXPECT_EQ(round.outcome().exit_code, 75);
  EXPECT_EQ(round.outcome().root_cause->node_rank, 1);
}

TEST_F(Round, TheMonitorLooksOncePerIntervalAndOnlyWhileRunning) {
  EXPECT_FALSE(round.monitor_due(t0 + kMonitor - 1ms, true));
  EXPECT_TRUE(round.monitor_due(t0 + kMonitor, true));
  EXPECT_FALSE(round.monitor_due(t0 + kMonitor + 1ms, true)) << "once per interval";
  EXPECT_FALSE(round.monitor_due(t0 + 2 * kMonitor, false)) << "no worker runs";
  round.other_node_failed(worker_failure(5, 2), t0 + 2 * kMonitor);
  EXPECT_EQ(round.state(), RoundState::kStopPending);
  EXPECT_EQ(round.outcome().root_cause->node_rank, 2);
  EXPECT_FALSE(round.monitor_due(t0 + 10 * kMonitor, true)) << "stopping: no more looks";
}

TEST_F(Round, ALostStoreLetsTheWorkersAbortThenStopsThem) {
  round.store_lost("connection refused", t0);
  EXPECT_EQ(round.outcome().kind, RoundOutcome::Kind::kStoreLost);
  EXPECT_EQ(round.outcome().detail, "connection refused");
  EXPECT_FALSE(round.reports_worker_failures()) << "the workers' exits are its consequences";
  EXPECT_EQ(round.tick(t0), RoundAction::kNone);
  EXPECT_EQ(round.tick(t0 + 2s), RoundAction::kSignalWorkers);
}

TEST_F(Round, ASecondCauseWhileStoppingOnlyBringsTheSignalForward) {
  round.other_node_failed(consequence(5, 2), t0);
  FailureReport signalled;
  signalled.kind = "agent";
  signalled.signal = SIGTERM;
  round.agent_signalled(SIGTERM, signalled, signalled, t0 + 100ms);
  EXPECT_EQ(round.tick(t0 + 100ms), RoundAction::kSignalWorkers);
  // Once signalled, later causes change nothing.
  round.store_lost("gone again", t0 + 200ms);
  EXPECT_EQ(round.state(), RoundState::kSignalled);
  // The stop began with the first cause: the change timeline's "detected".
  ASSERT_TRUE(round.outcome().stop_began);
  EXPECT_EQ(*round.outcome().stop_began, t0);
}

TEST_F(Round, TheRoundEndsWhenTheWorkersAreReapedAndThePipesDrained) {
  EXPECT_FALSE(round.finished(true, true, t0));
  EXPECT_FALSE(round.finished(false, true, t0 + 1s)) << "output may still be in the pipes";
  EXPECT_EQ(round.next_wake(), t0 + kMonitor);
  EXPECT_FALSE(round.finished(false, true, t0 + 3s));
  EXPECT_TRUE(round.finished(false, true, t0 + 3s + 1ms)) << "2 s after the last reap";
  RoundStateMachine closed({kShutdown, kMonitor}, t0);
  EXPECT_TRUE(closed.finished(false, false, t0));
}

// What the agent does once a round is over (decide_after_round).
RoundOutcome outcome_of(RoundOutcome::Kind kind, const std::string& root_kind = "worker") {
  RoundOutcome o;
  o.kind = kind;
  if (kind == RoundOutcome::Kind::kFailed || kind == RoundOutcome::Kind::kInterrupted) {
    o.root_cause = worker_failure(1, 1);
    o.root_cause->kind = root_kind;
    if (root_kind == "agent") o.root_cause->signal = SIGTERM;  // the node was asked to stop
  }
  return o;
}

TEST(AfterRound, SuccessWaitsAtTheExitBarrierAndALostStoreEndsTheNode) {
  EXPECT_EQ(decide_after_round(outcome_of(RoundOutcome::Kind::kSucceeded), false, 0, 3),
            AfterRound::kExitBarrier);
  EXPECT_EQ(decide_after_round(outcome_of(RoundOutcome::Kind::kStoreLost), true, 0, 3),
            AfterRound::kStoreLost);
  EXPECT_EQ(decide_after_round(outcome_of(RoundOutcome::Kind::kInterrupted, "agent"), true, 0, 3),
            AfterRound::kLeave);
}

TEST(AfterRound, AChangeMetInProcessGoesToTheNextRoundWithoutARestart) {
  RoundOutcome regrouped;
  regrouped.kind = RoundOutcome::Kind::kRegrouped;
  regrouped.root_cause = worker_failure(1, 1);
  regrouped.root_cause->kind = "lost";
  EXPECT_EQ(decide_after_round(regrouped, true, 0, 0), AfterRound::kNextRound);
}

TEST(AfterRound, AFailureRestartsWhileRestartsAreLeftThenGivesUp) {
  const auto failed = outcome_of(RoundOutcome::Kind::kFailed);
  EXPECT_EQ(decide_after_round(failed, false, 0, 1), AfterRound::kRestart);
  EXPECT_EQ(decide_after_round(failed, false, 1, 1), AfterRound::kGiveUp);
  EXPECT_EQ(decide_after_round(failed, true, 0, 0), AfterRound::kGiveUp);
}

TEST(AfterRound, MembershipChangesMoveAnElasticGroupOnWithoutARestart) {
  for (const char* kind : {"membership", "agent", "lost"}) {
    const auto changed = outcome_of(RoundOutcome::Kind::kFailed, kind);
    // A node that left or was lost shrinks the group (its next round waits for no last call);
    // one waiting to join grows it.
    EXPECT_EQ(changed.root_cause->is_loss(), std::string(kind) != "membership") << kind;
    EXPECT_EQ(decide_after_round(changed, true, 0, 0), AfterRound::kNextRound) << kind;
    // A job of a fixed size treats them as failures.
    EXPECT_EQ(decide_after_round(changed, false, 0, 0), AfterRound::kGiveUp) << kind;
    EXPECT_EQ(decide_after_round(changed, false, 0, 2), AfterRound::kRestart) << kind;
  }
  EXPECT_FALSE(outcome_of(RoundOutcome::Kind::kFailed).root_cause->is_loss());  // a worker's
}

}  // namespace
}  // namespace ddprun
