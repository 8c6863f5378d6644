#pragma once
// Data-parallel training of any torch::nn::Module across the ranks of a Communicator, in the
// manner of PyTorch's DistributedDataParallel.
//
// Construction checks that every rank built the same parameters and buffers (same count, names'
// order, shapes and dtypes; a clear error on every rank otherwise) and copies rank 0's values to
// all ranks. From then on, every backward pass through the module averages its gradients across
// ranks before loss.backward() returns:
//
//   * Gradients live in flat buckets: parameters in reverse registration order (roughly the order
//     backward produces their gradients), the first bucket capped at 1 MiB so communication starts
//     early, the others at 25 MiB. Each parameter's .grad is a view into its bucket, so averaged
//     gradients need no copy back.
//   * A hook on each parameter's gradient accumulator marks it ready; when a bucket is complete it
//     is allreduced asynchronously on the communicator's thread while backward continues. Buckets
//     are launched strictly in index order, so every rank issues the same collectives.
//   * When the autograd engine finishes the backward pass it runs DDP's final callback, which
//     launches anything left (parameters that got no gradient contribute zeros), waits for all
//     buckets and, with bf16 compression, unpacks them.
//
// So a training step is the ordinary one: zero_grad(), forward, backward, optimizer step. Nothing
// needs calling between backward and step. Buffers (BatchNorm statistics) are not touched by
// backward; call sync_buffers() before forward to use rank 0's, as PyTorch does each forward.
//
// Not supported: sparse gradients, parameters on devices other than the CPU, and backward passes
// re-entered from inside a hook.
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "ddp/comm/communicator.h"

namespace torch::nn {
class Module;
}

namespace ddp {

enum class GradientCompression {
  kNone,      // allreduce float32 gradients
  kBFloat16,  // allreduce bfloat16 copies (half the bytes), then widen back: PyTorch's bf16 hook
};

struct DdpOptions {
  std::size_t bucket_cap_bytes = std::size_t{25} << 20;
  std::size_t first_bucket_cap_bytes = std::size_t{1} << 20;
  // Launch each bucket's allreduce from backward as soon as it is complete. Off: launch all of
  // them after backward (the same collectives, so bit-identical results; for comparison).
  bool overlap = true;
  GradientCompression compression = GradientCompression::kNone;
};

struct BucketInfo {
  std::vector<std::string> parameters;  // names, in bucket order
  std::size_t bytes = 0;                // float32/float64 bytes before compression
};

struct BackwardStats {
  int buckets = 0;
  int launched_during_backward = 0;  // by hooks, overlapping the rest of backward
  double wait_seconds = 0;           // blocked at the end of backward waiting for allreduces
};

class DistributedDataParallel {
 public:
  // Verifies the module is identical on all ranks and broadcasts rank 0's parameters and buffers.
  // `comm` must outlive this object. Throws ConfigError if the ranks' modules differ (naming the
  // first differing parameter and the ranks), or for unsupported parameters.
  DistributedDataParallel(std::shared_ptr<torch::nn::Module> module, Communicator& comm,
                          DdpOptions options = {});
  ~DistributedDataParallel();
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  torch::nn::Module& module() const { return *module_; }
  const std::shared_ptr<torch::nn::Module>& module_ptr() const { return module_; }
  Communicator& communicator() const { return comm_; }

  // Copies rank 0's buffers to every rank (one collective per dtype; nothing without buffers).
  void sync_buffers();

  // While a NoSync is alive, backward passes accumulate gradients locally without communicating;
  // the first backward after it averages everything accumulated, as PyTorch's no_sync().
  class NoSync {
   public:
    ~NoSync();
    NoSync(NoSync&& other) noexcept;
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;
    NoSync& operator=(NoSync&&) = delete;

   private:
    friend class DistributedDataParallel;
    explicit NoSync(DistributedDataParallel* owner);
    DistributedDataParallel* owner_;
  };
  [[nodiscard]] NoSync no_sync();

  const std::vector<BucketInfo>& buckets() const;
  BackwardStats last_backward() const;

 private:
  struct Reducer;

  std::shared_ptr<torch::nn::Module> module_;
  Communicator& comm_;
  DdpOptions options_;
  std::unique_ptr<Reducer> reducer_;
};

}  // namespace ddp
