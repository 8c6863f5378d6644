#include "parallel/reducer.h"

#include <ATen/ops/empty.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include "ddp/error.h"
#include "ddp/flight_recorder.h"
#include "parallel/bucket_assignment.h"

namespace ddp::detail {
namespace {

// Runs after a parameter's AccumulateGrad node, i.e. once its .grad holds this backward's sum.
class GradientReadyHook : public torch::autograd::FunctionPostHook {
 public:
  GradientReadyHook(Reducer* reducer, std::size_t index) : reducer_(reducer), index_(index) {}
  torch::autograd::variable_list operator()(
      const torch::autograd::variable_list& outputs,
      const torch::autograd::variable_list& /*inputs*/) override {
    reducer_->on_gradient_ready(index_);
    return outputs;
  }

 private:
  Reducer* reducer_;
  std::size_t index_;
};

// An alias of `flat`'s storage with `like`'s sizes and strides at `offset` elements. Made with
// set_ rather than a view op, so that autograd does not treat it as a view (optimizers call
// detach_() on gradients, which views refuse).
at::Tensor alias_into(const at::Tensor& flat, int64_t offset, const at::Tensor& like) {
  at::Tensor alias = at::empty({0}, flat.options());
  alias.set_(flat.storage(), flat.storage_offset() + offset, like.sizes(), like.strides());
  return alias;
}

// Dense tensors whose elements fill [0, numel) of their storage span (any permutation of
// strides, e.g. channels-last) can use their strides inside a bucket.
bool is_dense(const at::Tensor& t) { return t.is_non_overlapping_and_dense(); }

}  // namespace

Reducer::Reducer(std::vector<Parameter> parameters, Communicator& comm, DdpOptions options)
    : comm_(comm), options_(options) {
  for (auto& p : parameters) {
    if (!p.tensor.requires_grad()) continue;
    // Checked before any gradient is replaced or hook registered: a constructor that throws
    // half-way would leave hooks pointing at a reducer that never existed.
    if (!p.tensor.is_leaf()) {
      throw ConfigError("parameter '" + p.name +
                        "' is not a leaf tensor (it is computed from other tensors); "
                        "DistributedDataParallel reduces the gradients of leaf parameters only");
    }
    if (!p.tensor.device().is_cpu() || p.tensor.is_sparse() || !is_dense(p.tensor)) {
      throw ConfigError("parameter '" + p.name +
                        "' is not a dense CPU tensor; DistributedDataParallel supports dense "
                        "CPU parameters only");
    }
    if (p.tensor.scalar_type() != at::kFloat && p.tensor.scalar_type() != at::kDouble &&
        p.tensor.scalar_type() != at::kBFloat16 && p.tensor.scalar_type() != at::kHalf) {
      throw ConfigError("parameter '" + p.name + "' has dtype " +
                        c10::toString(p.tensor.scalar_type()) +
                        "; gradients must be floating point");
    }
    Slot slot;
    slot.name = std::move(p.name);
    slot.tensor = p.tensor;
    slots_.push_back(std::move(slot));
  }

  // Reverse registration order approximates the order in which backward produces gradients.
  std::vector<TensorSlot> order;
  for (std::size_t k = 0; k < slots_.size(); ++k) {
    const Slot& s = slots_[slots_.size() - 1 - k];
    order.push_back({static_cast<std::size_t>(s.tensor.numel()) * s.tensor.element_size(),
                     static_cast<int>(s.tensor.scalar_type())});
  }
  const auto assignment =
      assign_buckets(order, options_.first_bucket_cap_bytes, options_.bucket_cap_bytes);

  c10::AutoGradMode no_grad(false);
  for (const auto& members : assignment) {
    Bucket bucket;
    BucketInfo info;
    int64_t total = 0;
    for (std::size_t k : members) {
      const std::size_t index = slots_.size() - 1 - k;
      bucket.slots.push_back(index);
      total += slots_[index].tensor.numel();
    }
    const at::Tensor& first = slots_[bucket.slots.front()].tensor;
    bucket.flat = at::zeros({total}, first.options().requires_grad(false));
    if (options_.compression == GradientCompression::kBFloat16) {
      bucket.wire = at::empty({total}, bucket.flat.options().dtype(at::kBFloat16));
    }
    int64_t offset = 0;
    const std::size_t b = buckets_.size();
    for (std::size_t index : bucket.slots) {
      Slot& slot = slots_[index];
      slot.bucket = b;
      slot.view = alias_into(bucket.flat, offset, slot.tensor);
      // Existing gradients (e.g. a model trained before wrapping) carry over.
      if (slot.tensor.grad().defined()) slot.view.copy_(slot.tensor.grad());
      slot.tensor.mutable_grad() = slot.view;
      offset += slot.tensor.numel();
      info.parameters.push_back(slot.name);
    }
    info.bytes = static_cast<std::size_t>(total) * bucket.flat.element_size();
    buckets_.push_back(std::move(bucket));
    infos_.push_back(std::move(info));
  }

  for (std::size_t i = 0; i < slots_.size(); ++i) {
    Slot& slot = slots_[i];
    // The accumulator is held by the variable only weakly: keep it (and so the hook) alive.
    slot.accumulator = torch::autograd::impl::grad_accumulator(slot.tensor);
    slot.hook = slot.accumulator->add_post_hook(std::make_unique<GradientReadyHook>(this, i));
  }
}

Reducer::~Reducer() {
  for (auto& slot : slots_) {
    if (slot.accumulator) slot.accumulator->del_post_hook(slot.hook);
  }
  // Allreduces still in flight write into our buckets: let them finish first.
  for (auto& bucket : buckets_) {
    try {
      bucket.work.wait();
    } catch (...) {
    }
  }
}

void Reducer::set_sync(bool enabled) {
  std::lock_guard<std::mutex> lock(mutex_);
  sync_ = enabled;
}

BackwardStats Reducer::last_backward() const { return last_; }

void Reducer::start_backward() {
  next_launch_ = 0;
  current_ = {};
  current_.buckets = static_cast<int>(buckets_.size());
  for (auto& slot : slots_) slot.ready = false;
  for (auto& bucket : buckets_) {
    bucket.pending = bucket.slots.size();
    bucket.launched = false;
  }
  // Runs on this thread when the engine has finished the whole backward pass.
  torch::autograd::Engine::get_default_engine().queue_callback([this] { finish_backward(); });
  // Only once the pass will be finished: if queueing threw, the next pass starts afresh.
  in_backward_ = true;
}

void Reducer::adopt_gradient(Slot& slot) {
  at::Tensor& grad = slot.tensor.mutable_grad();
  if (!grad.defined()) {
    // No gradient (unused parameter, or gradients set to None): contribute zeros.
    slot.view.zero_();
  } else if (grad.data_ptr() != slot.view.data_ptr()) {
    // Autograd made a fresh tensor (the user replaced or reset .grad): move it into the bucket.
    slot.view.copy_(grad);
  }
  if (!grad.is_same(slot.view)) grad = slot.view;
}

void Reducer::on_gradient_ready(std::size_t index) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!sync_) return;  // no_sync(): gradients just accumulate in place
  if (!in_backward_) start_backward();
  Slot& slot = slots_[index];
  if (slot.ready) return;  // the engine fires each accumulator once per pass; be safe anyway
  c10::AutoGradMode no_grad(false);
  adopt_gradient(slot);
  slot.ready = true;
  Bucket& bucket = buckets_[slot.bucket];
  if (--bucket.pending == 0 && options_.overlap) {
    current_.launched_during_backward += launch_ready_buckets();
  }
}

int Reducer::launch_ready_buckets() {
  int launched = 0;
  while (next_launch_ < buckets_.size() && buckets_[next_launch_].pending == 0) {
    launch(buckets_[next_launch_]);
    ++next_launch_;
    ++launched;
  }
  return launched;
}

void Reducer::launch(Bucket& bucket) {
  // Names the op in the flight recorder, so that a hang diagnosis says which bucket it is.
  const flight::OpLabel label("bucket", &bucket - buckets_.data());
  if (options_.compression == GradientCompression::kBFloat16) {
    // PyTorch's bf16_compress_hook: divide first (in full precision), round, sum on the wire.
    bucket.flat.mul_(1.0 / comm_.size());
    bucket.wire.copy_(bucket.flat);
    bucket.work = comm_.allreduce_async(bucket.wire, ReduceOp::kSum);
  } else {
    bucket.work = comm_.allreduce_async(bucket.flat, ReduceOp::kAvg);
  }
  bucket.launched = true;
}

void Reducer::reset_after_failure() {
  for (auto& bucket : buckets_) {
    try {
      bucket.work.wait();
    } catch (...) {
    }
    bucket.work = Work();
  }
  in_backward_ = false;
}

void Reducer::finish_backward() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!in_backward_) return;
  c10::AutoGradMode no_grad(false);
  try {
    for (auto& slot : slots_) {
      if (slot.ready) continue;
      adopt_gradient(slot);
      slot.ready = true;
      --buckets_[slot.bucket].pending;
    }
    launch_ready_buckets();
    const auto start = std::chrono::steady_clock::now();
    for (auto& bucket : buckets_) {
      bucket.work.wait();
      bucket.work = Work();
      if (options_.compression == GradientCompression::kBFloat16) bucket.flat.copy_(bucket.wire);
    }
    current_.wait_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  } catch (...) {
    reset_after_failure();
    throw;
  }
  in_backward_ = false;
  last_ = current_;
}

}  // namespace ddp::detail
