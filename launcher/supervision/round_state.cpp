#include "supervision/round_state.h"

#include <algorithm>
#include <csignal>

namespace ddprun {

const char* to_string(RoundState state) {
  switch (state) {
    case RoundState::kRunning:
      return "running";
    case RoundState::kStopPending:
      return "stop pending";
    case RoundState::kSignalled:
      return "signalled";
    case RoundState::kKilled:
      return "killed";
  }
  return "unknown";
}

RoundStateMachine::RoundStateMachine(Timing timing, Clock::time_point now)
    : timing_(timing), next_monitor_(now + timing.monitor_interval) {}

void RoundStateMachine::stop(int signal, bool grace, Clock::time_point now) {
  const auto when =
      grace ? now + std::min(timing_.consequence_grace, timing_.shutdown_timeout) : now;
  if (state_ == RoundState::kRunning) {
    state_ = RoundState::kStopPending;
    stop_signal_ = signal;
    signal_at_ = when;
    outcome_.stop_began = now;
  } else if (state_ == RoundState::kStopPending) {
    stop_signal_ = signal;
    signal_at_ = std::min(signal_at_, when);
  }
}

bool RoundStateMachine::reports_worker_failures() const {
  // After a lost store, the workers' exits are its consequences and cannot be published anyway.
  return state_ < RoundState::kSignalled && outcome_.kind != RoundOutcome::Kind::kInterrupted &&
         outcome_.kind != RoundOutcome::Kind::kStoreLost;
}

void RoundStateMachine::worker_failed(const FailureReport& root_cause, Clock::time_point now) {
  outcome_.kind = RoundOutcome::Kind::kFailed;
  outcome_.root_cause = root_cause;
  stop(SIGTERM, root_cause.is_consequence(), now);
}

void RoundStateMachine::agent_signalled(int signal, const FailureReport& mine,
                                        const FailureReport& root_cause, Clock::time_point now) {
  outcome_.kind = RoundOutcome::Kind::kInterrupted;
  outcome_.signal = signal;
  outcome_.root_cause = root_cause;
  if (root_cause.to_json() == mine.to_json()) own_agent_record_ = mine;
  stop(signal, /*grace=*/false, now);
}

RoundAction RoundStateMachine::signalled_again() {
  state_ = RoundState::kKilled;
  return RoundAction::kKillWorkers;
}

bool RoundStateMachine::monitor_due(Clock::time_point now, bool any_worker_running) {
  if (now < next_monitor_) return false;
  next_monitor_ = now + timing_.monitor_interval;
  return state_ == RoundState::kRunning && any_worker_running;
}

void RoundStateMachine::other_node_failed(const FailureReport& failure, Clock::time_point now) {
  if (failure.kind != "lost") {
    worker_failed(failure, now);  // the same transition: a worker of the group failed
    return;
  }
  // The workers were told why (their DDP_ABORT_FILE) and give up their collectives themselves:
  // the stop signal waits for that as for a consequence.
  node_lost_ = true;
  outcome_.kind = RoundOutcome::Kind::kFailed;
  outcome_.root_cause = failure;
  stop(SIGTERM, /*grace=*/true, now);
}

void RoundStateMachine::store_lost(const std::string& detail, Clock::time_point now) {
  outcome_.kind = RoundOutcome::Kind::kStoreLost;
  outcome_.detail = detail;
  stop(SIGTERM, /*grace=*/true, now);  // the workers were told, as for a lost node
}

RoundAction RoundStateMachine::tick(Clock::time_point now) {
  if (state_ == RoundState::kStopPending && now >= signal_at_) {
    if (timing_.shutdown_timeout.count() == 0) stop_signal_ = SIGKILL;
    state_ = stop_signal_ == SIGKILL ? RoundState::kKilled : RoundState::kSignalled;
    kill_at_ = now + kill_after();
    return RoundAction::kSignalWorkers;
  }
  if (state_ == RoundState::kSignalled && now >= kill_at_) {
    state_ = RoundState::kKilled;
    return RoundAction::kKillWorkers;
  }
  return RoundAction::kNone;
}

std::chrono::milliseconds RoundStateMachine::kill_after() const {
  return node_lost_ ? std::min(timing_.shutdown_timeout, timing_.lost_node_kill_after)
                    : timing_.shutdown_timeout;
}

RoundStateMachine::Clock::time_point RoundStateMachine::next_wake() const {
  auto wake = next_monitor_;
  if (state_ == RoundState::kStopPending) wake = std::min(wake, signal_at_);
  if (state_ == RoundState::kSignalled) wake = std::min(wake, kill_at_);
  if (all_reaped_at_) wake = std::min(wake, *all_reaped_at_ + timing_.drain_time);
  return wake;
}

bool RoundStateMachine::finished(bool any_worker_running, bool pipes_open, Clock::time_point now) {
  if (any_worker_running) return false;
  if (!all_reaped_at_) all_reaped_at_ = now;
  return !pipes_open || now - *all_reaped_at_ > timing_.drain_time;
}

std::optional<std::pair<FailureReport, FailureReport>> RoundStateMachine::settle(
    const std::vector<ExitStatus>& statuses) {
  if (outcome_.kind != RoundOutcome::Kind::kInterrupted) return std::nullopt;
  outcome_.exit_code = 128 + outcome_.signal;
  for (const ExitStatus& st : statuses) {
    if (st.signal == 0 && st.code != 0) {
      outcome_.exit_code = st.code;  // the worker's own answer to the signal, e.g. 75
      break;
    }
  }
  if (!own_agent_record_ || outcome_.exit_code == own_agent_record_->exit_code) {
    return std::nullopt;
  }
  // Every node exits with the root cause's code: make it the workers' answer.
  FailureReport revised = *own_agent_record_;
  revised.exit_code = outcome_.exit_code;
  revised.message += "; its workers exited with code " + std::to_string(outcome_.exit_code);
  return std::make_pair(*own_agent_record_, revised);
}

AfterRound decide_after_round(const RoundOutcome& outcome, bool elastic, int restarts_used,
                              int max_restarts) {
  switch (outcome.kind) {
    case RoundOutcome::Kind::kSucceeded:
      return AfterRound::kExitBarrier;
    case RoundOutcome::Kind::kStoreLost:
      return AfterRound::kStoreLost;
    case RoundOutcome::Kind::kInterrupted:
      return AfterRound::kLeave;
    case RoundOutcome::Kind::kRegrouped:
      return AfterRound::kNextRound;
    case RoundOutcome::Kind::kFailed:
      break;
  }
  // A node joins, left or was lost: an elastic group goes on with the nodes it has.
  if (elastic && outcome.root_cause && outcome.root_cause->is_membership_change()) {
    return AfterRound::kNextRound;
  }
  return restarts_used < max_restarts ? AfterRound::kRestart : AfterRound::kGiveUp;
}

}  // namespace ddprun
