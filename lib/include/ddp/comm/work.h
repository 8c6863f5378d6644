#pragma once
// The handle of an asynchronous collective (in the spirit of c10d's Work): wait() blocks until
// the operation has finished and rethrows its error, if any.
#include <exception>
#include <memory>

namespace ddp {

namespace detail {
struct WorkState;
}

class Work {
 public:
  Work() = default;  // an already-completed no-op
  explicit Work(std::shared_ptr<detail::WorkState> state) : state_(std::move(state)) {}

  // Blocks until the operation completes; rethrows its exception (CommError, TimeoutError...).
  void wait();
  // True once the operation has finished, successfully or not. Never blocks.
  bool completed() const;

 private:
  std::shared_ptr<detail::WorkState> state_;
};

}  // namespace ddp
