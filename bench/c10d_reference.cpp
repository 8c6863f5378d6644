// Reference line: libtorch's c10d::ProcessGroupGloo, the backend PyTorch DDP uses on CPU.
#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "allreduce_variants.h"
#include "ddp/store.h"

namespace ddp::bench {
namespace {

// libtorch's own c10d client on the same store (ddp's server speaks its 1.13 protocol), under
// the same prefix.
c10::intrusive_ptr<c10d::Store> to_c10d(const Store& store) {
  c10d::TCPStoreOptions opts;
  opts.port = static_cast<std::uint16_t>(store.port());
  opts.isServer = false;
  opts.waitWorkers = false;
  opts.timeout = store.timeout();
  c10::intrusive_ptr<c10d::Store> base =
      c10::make_intrusive<c10d::TCPStore>(store.endpoint_host(), opts);
  if (store.prefix().empty()) return base;
  return c10::make_intrusive<c10d::PrefixStore>(store.prefix(), base);
}

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
