#pragma once
// The state machine of one supervised round: what Supervisor::supervise decides, kept apart from
// processes, pipes and the store so that every transition is unit-tested
// (tests/launcher/supervision/round_state_test.cpp). The model is torchelastic's WorkerState and
// _invoke_run: one explicit state, one transition per event.
//
//   kRunning ──a worker fails / another node failed / the store is lost──▶ kStopPending
//            ──ddprun is signalled──▶ kStopPending (due at once)
//   kStopPending ──stop time (tick)──▶ kSignalled, or kKilled when --shutdown-timeout is 0
//   kSignalled ──shutdown timeout (tick) / another signal to ddprun──▶ kKilled
//
// A worker failing before the stop signal is reported whatever the state (it may be the real
// cause, only slower to exit than the peer whose collective it broke); after the signal, or once
// ddprun itself was signalled, exits are consequences. The round ends once every worker is
// reaped and their pipes are drained (finished()).
#include <chrono>
#include <csignal>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "diagnosis/failure_report.h"
#include "supervision/worker_process.h"

namespace ddprun {

struct RoundOutcome {
  enum class Kind {
    kSucceeded,    // every worker on this node exited 0
    kFailed,       // a worker here or on another node failed: see root_cause
    kInterrupted,  // ddprun itself got a signal: see signal, exit_code
    kStoreLost,    // the rendezvous store stopped answering
    kRegrouped,    // a membership change met in-process: the workers run on (regroup_offer.h)
  };
  Kind kind = Kind::kSucceeded;
  std::optional<FailureReport> root_cause;
  int signal = 0;
  int exit_code = 0;
  std::string detail;
  // When the round began to stop (this node learned of its end); unset while it runs.
  std::optional<std::chrono::steady_clock::time_point> stop_began;
};

enum class RoundState {
  kRunning,      // the workers run and nothing has gone wrong
  kStopPending,  // the round is over for this node; the stop signal goes out at its time
  kSignalled,    // the stop signal went out; SIGKILL follows after --shutdown-timeout
  kKilled,       // SIGKILL went out
};
const char* to_string(RoundState state);

// What the supervisor must do to its workers after an event.
enum class RoundAction {
  kNone,
  kSignalWorkers,  // send stop_signal() to every worker's process group
  kKillWorkers,    // send SIGKILL to every worker's process group
};

class RoundStateMachine {
 public:
  using Clock = std::chrono::steady_clock;

  struct Timing {
    std::chrono::milliseconds shutdown_timeout;  // from the stop signal to SIGKILL
    std::chrono::milliseconds monitor_interval;  // between looks for another node's failure
    // How long workers may take to exit on their own after a collective failure, which is most
    // likely the echo of a worker that is dying more slowly: the real cause gets reported rather
    // than masked by the stop signal.
    std::chrono::milliseconds consequence_grace = std::chrono::seconds(2);
    // After the last worker is reaped, how long to keep reading output still in the pipes.
    std::chrono::milliseconds drain_time = std::chrono::seconds(2);
    // When a node was lost, from the stop signal to SIGKILL (at most shutdown_timeout): workers
    // blocked in a collective with the lost node cannot finish a step or checkpoint.
    std::chrono::milliseconds lost_node_kill_after = std::chrono::seconds(2);
  };

  RoundStateMachine(Timing timing, Clock::time_point now);

  RoundState state() const { return state_; }
  const RoundOutcome& outcome() const { return outcome_; }
  // The signal kSignalWorkers sends.
  int stop_signal() const { return stop_signal_; }

  // --- Events ---------------------------------------------------------------------------------
  // Whether a worker's non-zero exit is reported (and published) rather than taken for a
  // consequence of the stop.
  bool reports_worker_failures() const;
  // A worker failed; `root_cause` is the group's first failure as the store holds it after this
  // one was published (this report, or another node's earlier one).
  void worker_failed(const FailureReport& root_cause, Clock::time_point now);
  // Whether a signal to ddprun now kills the workers at once (the stop signal already went out)
  // rather than starting the stop.
  bool signal_kills_now() const { return state_ >= RoundState::kSignalled; }
  // ddprun got `signal` and it does not kill at once: `mine` is this node's agent record and
  // `root_cause` the group's first failure as the store holds it after `mine` was published.
  void agent_signalled(int signal, const FailureReport& mine, const FailureReport& root_cause,
                       Clock::time_point now);
  // ddprun got a signal after the stop signal went out: SIGKILL now.
  RoundAction signalled_again();
  // Whether it is time to look for another node's failure (and the store's health); true at
  // most once per --monitor-interval, and only while running.
  bool monitor_due(Clock::time_point now, bool any_worker_running);
  void other_node_failed(const FailureReport& failure, Clock::time_point now);
  void store_lost(const std::string& detail, Clock::time_point now);

  // --- Time -----------------------------------------------------------------------------------
  // The action due at `now` (the stop signal, or SIGKILL after the shutdown timeout).
  RoundAction tick(Clock::time_point now);
  // From the stop signal to SIGKILL: the shutdown timeout, shorter when a node was lost.
  std::chrono::milliseconds kill_after() const;
  // When the supervisor must wake up next, whatever happens on its pipes.
  Clock::time_point next_wake() const;
  // Whether the round is over: no worker runs, and the pipes are closed or drain_time has passed
  // since the last one was reaped.
  bool finished(bool any_worker_running, bool pipes_open, Clock::time_point now);

  // --- The end --------------------------------------------------------------------------------
  // Settles the exit code of an interrupted round: the workers' own answer to the signal (e.g.
  // 75) where one gave it, else 128 + signal. Returns the agent record to publish in place of
  // this node's own one, when the code changed it.
  std::optional<std::pair<FailureReport, FailureReport>> settle(
      const std::vector<ExitStatus>& statuses);
  // Replaces the root cause (after the revised agent record was stored).
  void set_root_cause(const FailureReport& root_cause) { outcome_.root_cause = root_cause; }

 private:
  // Starts the stop (kRunning), or brings it forward (kStopPending); `grace` delays the signal.
  void stop(int signal, bool grace, Clock::time_point now);

  Timing timing_;
  RoundState state_ = RoundState::kRunning;
  RoundOutcome outcome_;
  std::optional<FailureReport> own_agent_record_;  // this node's record, when it is the cause
  int stop_signal_ = SIGTERM;
  Clock::time_point signal_at_{};
  Clock::time_point kill_at_{};
  Clock::time_point next_monitor_;
  std::optional<Clock::time_point> all_reaped_at_;
  bool node_lost_ = false;
};

// What the agent does once a round is over: torchelastic's _invoke_run decision, kept pure so
// that it is tested beside the round's state machine (agent.cpp acts on it).
enum class AfterRound {
  kExitBarrier,  // this node's workers all succeeded: wait for the others, then exit 0
  kStoreLost,    // the rendezvous store stopped answering: exit 69
  kNextRound,    // a membership change of an elastic job: the next round, no restart used
  kLeave,        // ddprun was signalled: report, and leave with the workers' answer
  kRestart,      // a failure with restarts left: the next round, one restart used
  kGiveUp,       // a failure and no restart left: settle the root cause with the others, exit
};

// `restarts_used`: the failed rounds before this one (NodeAssignment::restarts).
AfterRound decide_after_round(const RoundOutcome& outcome, bool elastic, int restarts_used,
                              int max_restarts);

}  // namespace ddprun
