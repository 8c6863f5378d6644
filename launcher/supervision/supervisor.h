#pragma once
// Runs one round of this node's workers: spawns them with torchrun's environment, pumps their
// output, watches for exits, for signals to ddprun and (every --monitor-interval) for a failure
// published by another node; on any failure stops the whole local group (the signal, then
// SIGKILL after --shutdown-timeout) and reports the root cause. What to do when is decided by
// the round's state machine (round_state.h); this class does the I/O.
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "config/host_facts.h"
#include "config/launch_config.h"
#include "config/worker_env.h"
#include "diagnosis/failure_report.h"
#include "metrics/health_endpoint.h"
#include "metrics/metrics_endpoint.h"
#include "placement/binding_plan.h"
#include "rendezvous/rendezvous.h"
#include "supervision/round_state.h"
#include "supervision/signal_inbox.h"

namespace ddprun {

class FilteredCopy;
class FileTimerServer;

class WorkerProcess;
class WorkerOutput;

class Supervisor {
 public:
  // `program` is the resolved path of config.command[0]; `log_root` holds attempt_N/ folders.
  Supervisor(const LaunchConfig& config, const EnvMap& agent_env, std::string program,
             std::string log_root, SignalInbox& inbox, std::string hostname);
  ~Supervisor();

  // Starts this node's workers for `node`, with their store at `store`.
  void start(const NodeAssignment& node, const WorkerStore& store);
  // Whether the running workers were started for exactly this assignment.
  bool started_for(const NodeAssignment& node) const;
  // Kills and reaps the workers started last (when the rendezvous assigned something else).
  void discard();
  // Whether the last round ended in an in-process regroup (RoundOutcome::kRegrouped): its
  // workers run on, waiting for their place in the next round, which place() gives them
  // (regroup_offer.h) in place of start().
  bool awaiting_place() const { return awaiting_place_; }
  void place(const NodeAssignment& node, const WorkerStore& store);
  // Supervises the started workers until they all exit (see the file comment).
  RoundOutcome supervise(const NodeAssignment& node, Rendezvous& rendezvous);

  // How each worker of the last round ended: failed on its own (a failure it reported), or
  // not (it succeeded, or was stopped after another failure).
  struct WorkerResult {
    int rank = 0;
    int local_rank = 0;
    int pid = 0;
    int exit_code = 0;
    bool failed = false;
  };
  std::vector<WorkerResult> results() const;

  // --numa-binding: local rank i is bound to plan[i].cpus and runs plan[i].threads threads
  // (placement/binding_plan.h), from the next start on.
  void bind_workers(std::vector<RankPlacement> plan) { placement_ = std::move(plan); }

  // Tells `board` (which must outlive this) of each start and exit, for --metrics-port.
  void report_to(MetricsBoard* board) { board_ = board; }
  // Every turn of a round's loop counts as the agent's progress (health_endpoint.h).
  void report_progress_to(AgentHealth* health) { health_ = health; }
  // Calls `fn` once, from supervise(), when a worker of the started round first reports a
  // training step (its live metrics, ddp/live_metrics.h); dropped when the round ends first.
  void on_first_step(std::function<void()> fn) { first_step_ = std::move(fn); }

  // The folder of one worker's logs and error file in a round.
  std::string worker_dir(int round, int local_rank) const;
  // Where this node's workers write their --trace-steps timelines in a round (DDP_TRACE_DIR);
  // "" when the agent's environment sets DDP_TRACE_DIR itself (ddprun then leaves them alone).
  std::string trace_dir(int round) const;

 private:
  struct Worker;
  struct FilteredCopies {
    std::shared_ptr<FilteredCopy> out, err;
  };
  FilteredCopies filtered_copies(int round) const;
  // An elastic job's worker gets DDP_REGROUP_FILE in `dir` (regroup_offer.h), unless
  // DDPRUN_REGROUP=0, and DDP_REGROUP_WAIT_SEC.
  void offer_regroup_to(Worker& w, const std::string& dir, EnvMap& env) const;
  // Tells the metrics board (--metrics-port) that the workers run for `node`.
  void report_started(const NodeAssignment& node);
  void open_outputs(Worker& w, const std::string& dir, const FilteredCopies& copies) const;
  // The round's file-timer watchdog, when TORCHELASTIC_ENABLE_FILE_TIMER=1; the pipe's path for
  // the workers ("" for none).
  std::string start_file_timer(int round);
  struct WorkerPids;
  std::shared_ptr<WorkerPids> worker_pids_;
  std::unique_ptr<FileTimerServer> file_timer_;
  class Round;  // one supervised round (supervisor.cpp)

  const LaunchConfig& config_;
  const EnvMap& agent_env_;
  std::string program_;
  std::string log_root_;
  SignalInbox& inbox_;
  std::string hostname_;
  std::vector<Worker> workers_;
  std::optional<NodeAssignment> started_;
  bool awaiting_place_ = false;
  std::vector<RankPlacement> placement_;  // by local rank; empty: no binding
  MetricsBoard* board_ = nullptr;
  AgentHealth* health_ = nullptr;
  std::function<void()> first_step_;
};

}  // namespace ddprun
