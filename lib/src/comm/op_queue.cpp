#include "comm/op_queue.h"

#include <algorithm>

#include "ddp/error.h"

namespace ddp {
namespace detail {

// The queue itself, shared with the worker thread and reachable from each queued op's WorkState
// (weakly), so that a waiter can run its op once the queue is idle.
class OpQueueCore {
 public:
  bool begin_inline();
  void end_inline();
  void push(std::function<void()> op, const std::shared_ptr<WorkState>& state);
  // While nothing runs and `state`'s op has not started, runs the next op on the caller, up to
  // and including that one; true if it ran it.
  bool run_through(const std::shared_ptr<WorkState>& state);
  void worker_loop();
  // Marks the queue stopping, waits for the op in flight, fails the ones not started.
  void stop();

 private:
  struct Pending {
    std::function<void()> op;
    std::shared_ptr<WorkState> state;
  };
  static void execute(Pending& next);
  // Ends an op that ran (on the worker or a waiter); wakes the worker if ops wait.
  void end_op(std::unique_lock<std::mutex>& lock);

  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Pending> pending_;
  bool busy_ = false;  // an op is executing (on the worker, inline or on a waiter)
  bool stopping_ = false;
};

}  // namespace detail

void detail::WorkState::finish(std::exception_ptr e) {
  {
    std::lock_guard<std::mutex> lock(mutex);
    error = std::move(e);
    done = true;
  }
  done_cv.notify_all();
}

void Work::wait() {
  if (!state_) return;
  // Not started and the queue idle: run it (and what is ahead of it) here rather than sleep
  // until the worker does.
  if (auto queue = state_->queue.lock(); queue && !completed()) queue->run_through(state_);
  std::unique_lock<std::mutex> lock(state_->mutex);
  state_->done_cv.wait(lock, [&] { return state_->done; });
  if (state_->error) std::rethrow_exception(state_->error);
}

bool Work::completed() const {
  if (!state_) return true;
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->done;
}

namespace detail {

bool OpQueueCore::begin_inline() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (stopping_) throw Error("communicator is shut down; no further collectives can run");
  if (!pending_.empty() || busy_) return false;
  busy_ = true;
  return true;
}

void OpQueueCore::end_inline() {
  std::unique_lock<std::mutex> lock(mutex_);
  end_op(lock);
}

void OpQueueCore::end_op(std::unique_lock<std::mutex>& lock) {
  busy_ = false;
  // An idle worker waits for a queued op; a wake-up with nothing queued would only cost it
  // (and the core it shares with the ranks) a context switch.
  const bool wake = !pending_.empty() || stopping_;
  lock.unlock();
  if (wake) cv_.notify_all();
}

void OpQueueCore::push(std::function<void()> op, const std::shared_ptr<WorkState>& state) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) throw Error("communicator is shut down; no further collectives can run");
    pending_.push_back({std::move(op), state});
  }
  cv_.notify_all();
}

void OpQueueCore::execute(Pending& next) {
  std::exception_ptr error;
  try {
    next.op();
  } catch (...) {
    error = std::current_exception();
  }
  next.state->finish(error);
}

bool OpQueueCore::run_through(const std::shared_ptr<WorkState>& state) {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stopping_ && !busy_) {
    const bool queued = std::any_of(pending_.begin(), pending_.end(),
                                    [&](const Pending& p) { return p.state == state; });
    if (!queued) return false;
    Pending next = std::move(pending_.front());
    pending_.pop_front();
    busy_ = true;
    lock.unlock();
    execute(next);
    lock.lock();
    end_op(lock);  // unlocks
    if (next.state == state) return true;
    lock.lock();
  }
  return false;
}

void OpQueueCore::worker_loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    cv_.wait(lock, [&] { return stopping_ || (!pending_.empty() && !busy_); });
    if (stopping_) return;
    Pending next = std::move(pending_.front());
    pending_.pop_front();
    busy_ = true;
    lock.unlock();
    execute(next);
    lock.lock();
    busy_ = false;
    cv_.notify_all();
  }
}

void OpQueueCore::stop() {
  std::deque<Pending> abandoned;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    stopping_ = true;
    // Let the op in flight finish (it is bounded by the timeout); drop the rest.
    cv_.wait(lock, [&] { return !busy_; });
    abandoned.swap(pending_);
  }
  cv_.notify_all();
  for (auto& p : abandoned) {
    p.state->finish(std::make_exception_ptr(
        Error("communicator was shut down before this collective started")));
  }
}

OpQueue::OpQueue(WorkerStart start) : core_(std::make_shared<OpQueueCore>()), start_(start) {}

OpQueue::~OpQueue() { stop(); }

bool OpQueue::begin_inline() { return core_->begin_inline(); }

void OpQueue::end_inline() { core_->end_inline(); }

Work OpQueue::submit(std::function<void()> op) {
  auto state = std::make_shared<WorkState>();
  state->queue = core_;
  core_->push(std::move(op), state);
  if (start_ == WorkerStart::kOnFirstSubmit) start_worker();
  return Work(state);
}

void OpQueue::start_worker() {
  std::lock_guard<std::mutex> lock(worker_mutex_);
  if (!worker_.joinable()) worker_ = std::thread([core = core_] { core->worker_loop(); });
}

void OpQueue::stop() {
  core_->stop();
  std::lock_guard<std::mutex> lock(worker_mutex_);
  if (worker_.joinable()) worker_.join();
}

}  // namespace detail
}  // namespace ddp
