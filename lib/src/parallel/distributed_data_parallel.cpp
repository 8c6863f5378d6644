#include "ddp/parallel/distributed_data_parallel.h"

#include <unordered_set>

#include <torch/nn/module.h>

#include "ddp/error.h"
#include "parallel/module_state_sync.h"
#include "parallel/reducer.h"

namespace ddp {

struct DistributedDataParallel::Reducer : detail::Reducer {
  using detail::Reducer::Reducer;
};

namespace {

// Parameters and buffers in registration order, each tensor once (modules may share them).
std::vector<detail::NamedTensor> module_state(const torch::nn::Module& module) {
  std::vector<detail::NamedTensor> state;
  std::unordered_set<const void*> seen;
  for (const auto& item : module.named_parameters()) {
    if (seen.insert(item.value().unsafeGetTensorImpl()).second) {
      state.push_back({"parameter", item.key(), item.value()});
    }
  }
  for (const auto& item : module.named_buffers()) {
    if (seen.insert(item.value().unsafeGetTensorImpl()).second) {
      state.push_back({"buffer", item.key(), item.value()});
    }
  }
  return state;
}

}  // namespace

DistributedDataParallel::DistributedDataParallel(std::shared_ptr<torch::nn::Module> module,
                                                 Communicator& comm, DdpOptions options)
    : module_(std::move(module)), comm_(comm), options_(options) {
  if (!module_) throw ConfigError("DistributedDataParallel needs a module, got null");
  if (options_.bucket_cap_bytes == 0 || options_.first_bucket_cap_bytes == 0) {
    throw ConfigError("DistributedDataParallel bucket caps must be positive");
  }
  const auto state = module_state(*module_);
  detail::verify_same_tensors(state, comm_);
  std::vector<at::Tensor> tensors;
  std::vector<detail::Reducer::Parameter> parameters;
  for (const auto& t : state) {
    tensors.push_back(t.tensor);
    if (t.kind == "parameter") parameters.push_back({t.name, t.tensor});
  }
  detail::broadcast_from_rank0(tensors, comm_);
  reducer_ = std::make_unique<Reducer>(std::move(parameters), comm_, options_);
}

DistributedDataParallel::~DistributedDataParallel() = default;

void DistributedDataParallel::sync_buffers() {
  std::vector<at::Tensor> buffers;
  for (const auto& t : module_state(*module_)) {
    if (t.kind == "buffer") buffers.push_back(t.tensor);
  }
  detail::broadcast_from_rank0(buffers, comm_);
}

DistributedDataParallel::NoSync::NoSync(DistributedDataParallel* owner) : owner_(owner) {
  owner_->reducer_->set_sync(false);
}

DistributedDataParallel::NoSync::NoSync(NoSync&& other) noexcept : owner_(other.owner_) {
  other.owner_ = nullptr;
}

DistributedDataParallel::NoSync::~NoSync() {
  if (owner_) owner_->reducer_->set_sync(true);
}

DistributedDataParallel::NoSync DistributedDataParallel::no_sync() { return NoSync(this); }

const std::vector<BucketInfo>& DistributedDataParallel::buckets() const {
  return reducer_->bucket_infos();
}

BackwardStats DistributedDataParallel::last_backward() const { return reducer_->last_backward(); }

}  // namespace ddp
