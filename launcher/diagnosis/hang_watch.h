#pragma once
// Hang detection on one node, run from the supervisor's loop. Every second the agent reads its
// workers' flight recorders (files it named in DDP_FLIGHT_RECORDER_FILE). When one has waited in
// a collective longer than its threshold (DDP_HANG_WARN_SEC, at most 3/4 of the op timeout), the
// agent raises the round's hang in the store; every agent, seeing it, publishes one report of
// its workers (their recorders, process states, and the stacks of those that may be the cause,
// taken with eu-stack or gdb off the supervisor's thread); node 0's agent gathers the reports
// (bounded) and logs one diagnosis naming the rank that holds the others up (hang_diagnosis.h).
// Once per round. Store keys: round<N>/hang/{raised,node/<g>,diagnosis,culprits}.
//
// Workers without a recorder (Python workers, whose collectives are c10d's) are watched from
// /proc instead: when one's main thread has neither run nor woken up for DDP_HANG_WARN_SEC, the
// agent takes its native stack, and raises the hang if it waits in c10d (c10d_wait_of). The
// reports then carry every such worker's stack, which tells the ranks waiting in c10d from the
// one that is not; with DDP_PY_STACK_SIGNAL set, the agents send that signal to the Python
// ranks named, for a faulthandler traceback in their output.
#include <chrono>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "diagnosis/hang_diagnosis.h"

namespace ddp {
class Store;
}

namespace ddprun {

struct WatchedWorker {
  int rank = -1;
  int local_rank = -1;
  int pid = 0;
  std::string recorder_file;
};

class HangWatch {
 public:
  using Clock = std::chrono::steady_clock;
  struct Options {
    std::chrono::milliseconds period{1000};           // between reads of the recorders
    std::chrono::milliseconds gather_timeout{15000};  // node 0's wait for every node's report
    std::chrono::milliseconds stack_timeout{5000};    // per stack taken
  };

  // `store` is the round's view (round<N>/hang).
  HangWatch(std::shared_ptr<ddp::Store> store, int node, int nodes, std::string host,
            std::vector<WatchedWorker> workers, Options options);
  ~HangWatch();
  HangWatch(const HangWatch&) = delete;
  HangWatch& operator=(const HangWatch&) = delete;

  // Does what is due; cheap when nothing is. Store errors are logged, not thrown (the
  // supervisor's own store checks decide what a lost store means).
  void tick(Clock::time_point now);
  // The round's diagnosis once known here (node 0 composed it, or read it from the store).
  const std::string& diagnosis() const { return diagnosis_; }

 private:
  // A worker without a recorder: its main thread's activity (CPU ticks + context switches) as
  // last read, since when it has not changed, and when its stack was last taken.
  struct Activity {
    long long count = -1;
    Clock::time_point since{};
    Clock::time_point probed{};
    Clock::time_point frozen_until{};  // a stack tool's attach perturbs the counts: not activity
  };

  bool local_wait_exceeded() const;
  // Samples the recorder-less workers; true once one's stack shows it blocked in a c10d wait.
  bool c10d_wait_confirmed(Clock::time_point now);
  // tick's steps: raise the warning (this node's, or another's seen in the store); take this
  // node's report on a thread of its own; publish it once taken; then node 0 gathers every
  // node's and diagnoses, the others wait for its diagnosis.
  bool raise_if_due(Clock::time_point now);
  void start_report(Clock::time_point now);
  bool publish_report();
  void gather(Clock::time_point now);
  void follow_node_zero(Clock::time_point now);
  // Sends DDP_PY_STACK_SIGNAL to this node's recorder-less workers among `culprits`.
  void ask_python_stacks(const std::string& culprits) const;

  std::shared_ptr<ddp::Store> store_;
  int node_;
  int nodes_;
  std::string host_;
  std::vector<WatchedWorker> workers_;
  Options options_;
  Clock::time_point next_check_{};
  bool raised_ = false;
  Clock::time_point raised_at_{};
  std::future<NodeHangReport> report_;
  bool published_ = false;
  bool done_ = false;
  std::string diagnosis_;
  std::chrono::milliseconds python_threshold_;  // DDP_HANG_WARN_SEC; 0: off
  std::string python_stack_signal_;             // DDP_PY_STACK_SIGNAL; "" when off
  std::vector<Activity> activity_;
  std::future<std::pair<std::size_t, std::string>> probe_;  // worker index, its stack
};

// Reads one worker's state: its flight recorder (if any), its process state, and, when it may be
// the cause (locally_suspect), its stacks. Blocking (stacks take seconds).
WorkerHangState read_worker_state(const WatchedWorker& worker,
                                  std::chrono::milliseconds stack_timeout);

// The threads' stacks of `pid`: eu-stack (elfutils), else gdb; "" with the reason in `note` when
// neither could (missing, no ptrace permission, time out).
std::string take_stacks(int pid, std::chrono::milliseconds timeout, std::string& note);

}  // namespace ddprun
