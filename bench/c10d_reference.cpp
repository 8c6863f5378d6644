// Reference line: libtorch's c10d::ProcessGroupGloo, the backend PyTorch DDP uses on CPU.
#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include "allreduce_variants.h"
#include "ddp/store_c10d.h"

namespace ddp::bench {
namespace {

class C10dAllreduce final : public AllreduceVariant {
 public:
  explicit C10dAllreduce(c10::intrusive_ptr<c10d::ProcessGroupGloo> group)
      : group_(std::move(group)) {}
  void prepare(float* data, std::size_t count) override {
    tensors_ = {at::from_blob(data, {static_cast<int64_t>(count)}, at::kFloat)};
  }
  void run() override { group_->allreduce(tensors_)->wait(); }

 private:
  c10::intrusive_ptr<c10d::ProcessGroupGloo> group_;
  std::vector<at::Tensor> tensors_;
};

}  // namespace

VariantFactory c10d_gloo_variant() {
  return {
      "c10d_ProcessGroupGloo", [](std::shared_ptr<Store> store, int rank, int size) {
        auto options = c10d::ProcessGroupGloo::Options::create();
        options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
        auto group =
            c10::make_intrusive<c10d::ProcessGroupGloo>(to_c10d(*store), rank, size, options);
        return std::unique_ptr<AllreduceVariant>(new C10dAllreduce(group));
      }};
}

}  // namespace ddp::bench
