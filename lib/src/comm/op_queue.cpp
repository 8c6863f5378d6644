#include "comm/op_queue.h"

#include "ddp/error.h"

namespace ddp {

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

OpQueue::~OpQueue() { stop(); }

bool OpQueue::begin_inline() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (stopping_) throw Error("communicator is shut down; no further collectives can run");
  if (!pending_.empty() || busy_) return false;
  busy_ = true;
  return true;
}

void OpQueue::end_inline() {
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    busy_ = false;
    // An idle worker waits for a queued op; a wake-up with nothing queued would only cost it
    // (and the core it shares with the ranks) a context switch.
    wake = !pending_.empty() || stopping_;
  }
  if (wake) cv_.notify_all();
}

Work OpQueue::submit(std::function<void()> op) {
  auto state = std::make_shared<WorkState>();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) throw Error("communicator is shut down; no further collectives can run");
    pending_.push_back({std::move(op), state});
    if (!worker_.joinable()) worker_ = std::thread([this] { worker_loop(); });
  }
  cv_.notify_all();
  return Work(state);
}

void OpQueue::worker_loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    cv_.wait(lock, [&] { return stopping_ || (!pending_.empty() && !busy_); });
    if (stopping_) return;
    Pending next = std::move(pending_.front());
    pending_.pop_front();
    busy_ = true;
    lock.unlock();
    std::exception_ptr error;
    try {
      next.op();
    } catch (...) {
      error = std::current_exception();
    }
    next.state->finish(error);
    lock.lock();
    busy_ = false;
    cv_.notify_all();
  }
}

void OpQueue::stop() {
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
  if (worker_.joinable()) worker_.join();
}

}  // namespace detail
}  // namespace ddp
