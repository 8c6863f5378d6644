#pragma once
// The gradient side of DistributedDataParallel: buckets, autograd hooks, the end-of-backward
// callback. See ddp/parallel/distributed_data_parallel.h for the design.
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "ddp/comm/communicator.h"
#include "ddp/parallel/distributed_data_parallel.h"

namespace torch::autograd {
struct Node;
}

namespace ddp::detail {

class Reducer {
 public:
  struct Parameter {
    std::string name;
    at::Tensor tensor;
  };

  // `parameters` in registration order; the ones that require grad get buckets.
  Reducer(std::vector<Parameter> parameters, Communicator& comm, DdpOptions options);
  ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  void set_sync(bool enabled);
  const std::vector<BucketInfo>& bucket_infos() const { return infos_; }
  BackwardStats last_backward() const;

  // Called by the hooks and the engine callback.
  void on_gradient_ready(std::size_t index);
  void finish_backward();

 private:
  struct Slot {
    std::string name;
    at::Tensor tensor;
    std::size_t bucket = 0;
    at::Tensor view;  // this parameter's gradient inside its bucket
    bool ready = false;
    std::shared_ptr<torch::autograd::Node> accumulator;
    uintptr_t hook = 0;
  };
  struct Bucket {
    at::Tensor flat;
    at::Tensor wire;  // bfloat16 copy with compression
    std::vector<std::size_t> slots;
    std::size_t pending = 0;
    bool launched = false;
    Work work;
  };

  void start_backward();
  void adopt_gradient(Slot& slot);
  // Launches complete buckets in index order, stopping at the first incomplete one.
  int launch_ready_buckets();
  void launch(Bucket& bucket);
  void reset_after_failure();

  Communicator& comm_;
  DdpOptions options_;
  std::vector<Slot> slots_;
  std::vector<Bucket> buckets_;
  std::vector<BucketInfo> infos_;
  std::mutex mutex_;
  bool sync_ = true;
  bool in_backward_ = false;
  std::size_t next_launch_ = 0;
  BackwardStats current_;
  BackwardStats last_;
};

}  // namespace ddp::detail
