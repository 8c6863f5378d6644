#pragma once
// Ranks as threads of one process, joined by an in-memory Communicator, for unit tests of code
// that takes a Communicator& (the reducer, module state sync) without sockets or forks. Every
// collective waits until each rank has issued it (a rank that waits longer than the group's
// timeout fails with CommError, so a missing rank cannot hang a test), checks that all ranks
// issued the same one, and computes the result from all ranks' buffers, in double precision,
// rounding once to the buffer's type. Each rank's collectives are recorded in issue order.
#include <ATen/ATen.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "ddp/comm/communicator.h"
#include "ddp/error.h"

namespace ddp::testing {

// One collective as a rank issued it.
struct RecordedCollective {
  std::string op;  // "allreduce", "broadcast", "allgather", "reduce_scatter" or "barrier"
  const void* data = nullptr;  // the (input) buffer
  std::size_t count = 0;       // its elements
  DataType dtype = DataType::kFloat32;
  ReduceOp reduce = ReduceOp::kSum;
  int root = -1;
  at::Tensor input;  // a copy of the input buffer as the collective found it (undefined if empty)
};

inline at::ScalarType scalar_type_of(DataType type) {
  switch (type) {
    case DataType::kFloat32:
      return at::kFloat;
    case DataType::kFloat64:
      return at::kDouble;
    case DataType::kBFloat16:
      return at::kBFloat16;
    case DataType::kFloat16:
      return at::kHalf;
    case DataType::kInt32:
      return at::kInt;
    case DataType::kInt64:
      return at::kLong;
  }
  throw std::logic_error("unknown DataType");
}

// The buffer's memory as a 1-d tensor (no copy).
inline at::Tensor tensor_of(const Buffer& buffer) {
  return at::from_blob(buffer.data, {static_cast<int64_t>(buffer.count)},
                       at::TensorOptions().dtype(scalar_type_of(buffer.dtype)));
}

// "" when every rank returned; otherwise one line per rank that threw, with the first line of
// its message (torch's errors go on with a backtrace).
inline std::string failures(const std::vector<std::exception_ptr>& errors) {
  std::string text;
  for (std::size_t r = 0; r < errors.size(); ++r) {
    if (!errors[r]) continue;
    try {
      std::rethrow_exception(errors[r]);
    } catch (const std::exception& e) {
      const std::string what = e.what();
      text += "rank " + std::to_string(r) + ": " + what.substr(0, what.find('\n')) + "\n";
    } catch (...) {
      text += "rank " + std::to_string(r) + ": unknown exception\n";
    }
  }
  return text;
}

// The message of rank `rank`'s exception, or "" if it returned.
inline std::string error_of(const std::vector<std::exception_ptr>& errors, int rank) {
  if (!errors.at(rank)) return "";
  try {
    std::rethrow_exception(errors[rank]);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "unknown exception";
  }
}

class ThreadGroup {
 public:
  explicit ThreadGroup(int size,
                       std::chrono::milliseconds timeout = std::chrono::milliseconds(20000))
      : size_(size), timeout_(timeout) {}

  int size() const { return size_; }

  // The next `n` collectives fail on every rank with CommError (their buffers untouched).
  void fail_next(int n) {
    std::lock_guard<std::mutex> lock(mutex_);
    failures_left_ = n;
  }

  // Runs fn(comm) on one thread per rank (comm.rank() tells which); returns each rank's exception
  // (null if it returned). The communicators live until every thread has finished.
  std::vector<std::exception_ptr> run(const std::function<void(Communicator&)>& fn) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      calls_.assign(size_, {});
      arrivals_.assign(size_, {});
      arrived_ = 0;
      broken_ = false;
    }
    std::vector<std::unique_ptr<Member>> members;
    for (int r = 0; r < size_; ++r) members.push_back(std::make_unique<Member>(*this, r));
    std::vector<std::exception_ptr> errors(size_);
    std::vector<std::thread> threads;
    for (int r = 0; r < size_; ++r) {
      threads.emplace_back([&, r] {
        try {
          fn(*members[r]);
        } catch (...) {
          errors[r] = std::current_exception();
        }
      });
    }
    for (auto& t : threads) t.join();
    members.clear();
    return errors;
  }

  // What `rank` issued during the last run(), in order.
  std::vector<RecordedCollective> calls(int rank) const {
    std::lock_guard<std::mutex> lock(mutex_);
    return calls_.at(rank);
  }

 private:
  struct Arrival {
    std::string op;
    Buffer input;
    Buffer output;
    ReduceOp reduce = ReduceOp::kSum;
    int root = -1;
  };

  class Member final : public Communicator {
   public:
    Member(ThreadGroup& group, int rank)
        : Communicator(rank, group.size_, options_for(group)), group_(group) {}
    ~Member() override { shutdown(); }
    const char* backend_name() const override { return "thread-group"; }

   protected:
    void do_allreduce(Buffer buffer, ReduceOp op) override {
      group_.collective(rank(), {"allreduce", buffer, buffer, op, -1});
    }
    void do_broadcast(Buffer buffer, int root) override {
      group_.collective(rank(), {"broadcast", buffer, buffer, ReduceOp::kSum, root});
    }
    void do_allgather(Buffer input, Buffer output) override {
      group_.collective(rank(), {"allgather", input, output, ReduceOp::kSum, -1});
    }
    void do_reduce_scatter(Buffer input, Buffer output, ReduceOp op) override {
      group_.collective(rank(), {"reduce_scatter", input, output, op, -1});
    }
    void do_barrier() override {
      group_.collective(rank(), {"barrier", {}, {}, ReduceOp::kSum, -1});
    }

   private:
    static CommOptions options_for(const ThreadGroup& group) {
      CommOptions options;
      options.timeout = group.timeout_;
      return options;
    }
    ThreadGroup& group_;
  };

  void collective(int rank, const Arrival& arrival) {
    std::unique_lock<std::mutex> lock(mutex_);
    RecordedCollective call;
    call.op = arrival.op;
    call.data = arrival.input.data;
    call.count = arrival.input.count;
    call.dtype = arrival.input.dtype;
    call.reduce = arrival.reduce;
    call.root = arrival.root;
    if (arrival.input.count > 0) call.input = tensor_of(arrival.input).clone();
    calls_[rank].push_back(call);
    if (broken_) throw CommError(arrival.op, rank, -1, "the thread group is broken");

    const unsigned long long round = round_;
    arrivals_[rank] = arrival;
    if (++arrived_ == size_) {
      arrived_ = 0;
      error_ = complete_round();
      ++round_;
      changed_.notify_all();
    } else if (!changed_.wait_for(lock, timeout_, [&] { return round_ != round; })) {
      broken_ = true;  // the others may still write through this rank's arrival: stop them
      throw CommError(arrival.op, rank, -1, "timed out waiting for the other ranks");
    }
    if (!error_.empty()) throw CommError(arrival.op, rank, -1, error_);
  }

  // Checks that the ranks agree and computes every rank's result; returns an error or "".
  std::string complete_round() {
    const Arrival& first = arrivals_[0];
    for (int r = 1; r < size_; ++r) {
      const Arrival& a = arrivals_[r];
      if (a.op != first.op || a.input.count != first.input.count ||
          a.input.dtype != first.input.dtype || a.output.count != first.output.count ||
          a.reduce != first.reduce || a.root != first.root) {
        return "rank " + std::to_string(r) + " issued " + a.op + " of " +
               std::to_string(a.input.count) + " elements but rank 0 " + first.op + " of " +
               std::to_string(first.input.count);
      }
    }
    if (failures_left_ > 0) {
      --failures_left_;
      return "injected failure";
    }
    const std::size_t n = first.input.count;
    if (first.op == "barrier" || (n == 0 && first.output.count == 0)) return "";
    if (first.op == "broadcast") {
      const std::size_t bytes = first.input.bytes();
      for (int r = 0; r < size_; ++r) {
        if (r != first.root)
          std::memcpy(arrivals_[r].input.data, arrivals_[first.root].input.data, bytes);
      }
      return "";
    }
    std::vector<at::Tensor> inputs;
    for (int r = 0; r < size_; ++r) inputs.push_back(tensor_of(arrivals_[r].input).to(at::kDouble));
    if (first.op == "allgather") {
      if (first.output.count != n * static_cast<std::size_t>(size_)) return "bad allgather sizes";
      const at::Tensor gathered = at::cat(inputs);
      for (int r = 0; r < size_; ++r) tensor_of(arrivals_[r].output).copy_(gathered);
      return "";
    }
    at::Tensor result = inputs[0].clone();
    for (int r = 1; r < size_; ++r) {
      switch (first.reduce) {
        case ReduceOp::kSum:
        case ReduceOp::kAvg:
          result.add_(inputs[r]);
          break;
        case ReduceOp::kMin:
          result = at::minimum(result, inputs[r]);
          break;
        case ReduceOp::kMax:
          result = at::maximum(result, inputs[r]);
          break;
      }
    }
    if (first.reduce == ReduceOp::kAvg) result.div_(size_);
    if (first.op == "allreduce") {
      for (int r = 0; r < size_; ++r) tensor_of(arrivals_[r].input).copy_(result);
      return "";
    }
    if (first.op == "reduce_scatter") {
      const auto block = static_cast<int64_t>(first.output.count);
      if (n != first.output.count * static_cast<std::size_t>(size_))
        return "bad reduce_scatter sizes";
      for (int r = 0; r < size_; ++r) {
        tensor_of(arrivals_[r].output).copy_(result.narrow(0, r * block, block));
      }
      return "";
    }
    return "unknown collective " + first.op;
  }

  const int size_;
  const std::chrono::milliseconds timeout_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<std::vector<RecordedCollective>> calls_;
  std::vector<Arrival> arrivals_;
  int arrived_ = 0;
  unsigned long long round_ = 0;
  std::string error_;
  int failures_left_ = 0;
  bool broken_ = false;
};

}  // namespace ddp::testing
