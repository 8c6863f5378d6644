#pragma once
// Runs a communicator's operations one at a time, in issue order, so that every rank executes
// the same sequence. Async operations go to a single communication thread; a blocking call made
// while that thread is idle runs inline on the caller, so small synchronous ops pay no
// cross-thread hand-off. So does a wait on an async op that the thread has not started yet
// (nothing ahead of it, nothing running): the waiter runs it itself instead of sleeping until the
// thread is scheduled, runs it and wakes the waiter. On a machine with fewer cores than busy
// threads (ranks x (caller + communication thread)) that is most of a small op's cost.
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>

#include "ddp/comm/work.h"

namespace ddp::detail {

class OpQueueCore;

struct WorkState {
  std::mutex mutex;
  std::condition_variable done_cv;
  bool done = false;
  std::exception_ptr error;
  // The queue the op waits in until it starts (expired once the queue is gone).
  std::weak_ptr<OpQueueCore> queue;

  void finish(std::exception_ptr e);
};

// Whether the communication thread starts with the first async op (always, outside tests).
enum class WorkerStart { kOnFirstSubmit, kManual };

class OpQueue {
 public:
  explicit OpQueue(WorkerStart start = WorkerStart::kOnFirstSubmit);
  ~OpQueue();
  OpQueue(const OpQueue&) = delete;
  OpQueue& operator=(const OpQueue&) = delete;

  // Runs `op` after everything issued before it; returns when it is done, rethrowing its error.
  // When nothing is queued or running, `op` runs inline on the caller, without being wrapped in
  // a std::function (which would allocate: a collective's arguments exceed its inline storage).
  template <typename Op>
  void run(Op&& op) {
    if (!begin_inline()) return submit(std::function<void()>(std::forward<Op>(op))).wait();
    struct EndInline {
      OpQueue& queue;
      ~EndInline() { queue.end_inline(); }
    } end{*this};
    op();
  }
  // Queues `op` after everything issued before it and returns at once.
  Work submit(std::function<void()> op);
  // Fails queued ops that have not started and joins the thread. Idempotent.
  void stop();
  // Starts the communication thread of a WorkerStart::kManual queue (tests).
  void start_worker();

 private:
  bool begin_inline();
  void end_inline();

  std::shared_ptr<OpQueueCore> core_;
  WorkerStart start_;
  std::mutex worker_mutex_;  // guards worker_ (async ops may come from several threads)
  std::thread worker_;
};

}  // namespace ddp::detail
