#pragma once
// Runs a communicator's operations one at a time, in issue order, so that every rank executes
// the same sequence. Async operations go to a single communication thread; a blocking call made
// while that thread is idle runs inline on the caller, so small synchronous ops pay no
// cross-thread hand-off.
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>

#include "ddp/comm/work.h"

namespace ddp::detail {

struct WorkState {
  std::mutex mutex;
  std::condition_variable done_cv;
  bool done = false;
  std::exception_ptr error;

  void finish(std::exception_ptr e);
};

class OpQueue {
 public:
  OpQueue() = default;
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

 private:
  struct Pending {
    std::function<void()> op;
    std::shared_ptr<WorkState> state;
  };
  void worker_loop();
  // Claims the queue for an inline op: true if nothing is queued or running.
  bool begin_inline();
  // Releases it, waking the worker only if an op was queued meanwhile (or stop() waits).
  void end_inline();

  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Pending> pending_;
  bool busy_ = false;  // an op is executing (on the worker or inline)
  bool stopping_ = false;
  std::thread worker_;
};

}  // namespace ddp::detail
