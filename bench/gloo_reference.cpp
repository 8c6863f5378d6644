// Reference lines: gloo's own algorithms, driven directly, with no ddp code in the timed path.
#include <gloo/allreduce.h>
#include <gloo/allreduce_halving_doubling.h>
#include <gloo/allreduce_ring.h>
#include <gloo/allreduce_ring_chunked.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>

#include "allreduce_variants.h"

namespace ddp::bench {
namespace {

class StoreAdapter final : public gloo::rendezvous::Store {
 public:
  explicit StoreAdapter(std::shared_ptr<ddp::Store> store) : store_(std::move(store)) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    store_->set(key, std::string(data.begin(), data.end()));
  }
  std::vector<char> get(const std::string& key) override {
    auto v = store_->get(key);
    return {v.begin(), v.end()};
  }
  void wait(const std::vector<std::string>& keys) override { store_->wait(keys); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& t) override {
    store_->wait(keys, t);
  }

 private:
  std::shared_ptr<ddp::Store> store_;
};

std::shared_ptr<gloo::Context> connect(std::shared_ptr<ddp::Store> store, int rank, int size) {
  gloo::transport::tcp::attr attr;
  attr.hostname = "127.0.0.1";
  auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
  StoreAdapter adapter(std::move(store));
  auto device = gloo::transport::tcp::CreateDevice(attr);
  context->connectFullMesh(adapter, device);
  return context;
}

template <template <typename> class Algorithm>
class ClassicAllreduce final : public AllreduceVariant {
 public:
  explicit ClassicAllreduce(std::shared_ptr<gloo::Context> context)
      : context_(std::move(context)) {}
  void prepare(float* data, std::size_t count) override {
    algorithm_ = std::make_unique<Algorithm<float>>(context_, std::vector<float*>{data},
                                                    static_cast<int>(count));
  }
  void run() override { algorithm_->run(); }

 private:
  std::shared_ptr<gloo::Context> context_;
  std::unique_ptr<Algorithm<float>> algorithm_;
};

// gloo::allreduce, the API torch's ProcessGroupGloo calls, with its ring or its bcube.
template <gloo::AllreduceOptions::Algorithm kAlgorithm>
class UnboundAllreduce final : public AllreduceVariant {
 public:
  explicit UnboundAllreduce(std::shared_ptr<gloo::Context> context)
      : context_(std::move(context)) {}
  void prepare(float* data, std::size_t count) override {
    data_ = data;
    count_ = count;
  }
  void run() override {
    gloo::AllreduceOptions opts(context_);
    opts.setAlgorithm(kAlgorithm);
    opts.setOutput(data_, count_);
    opts.setReduceFunction(
        static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
    gloo::allreduce(opts);
  }

 private:
  std::shared_ptr<gloo::Context> context_;
  float* data_ = nullptr;
  std::size_t count_ = 0;
};

template <typename Variant>
VariantFactory factory(const std::string& name) {
  return {name, [](std::shared_ptr<ddp::Store> store, int rank, int size) {
            return std::unique_ptr<AllreduceVariant>(new Variant(connect(store, rank, size)));
          }};
}

}  // namespace

std::vector<VariantFactory> raw_gloo_variants() {
  return {
      factory<ClassicAllreduce<gloo::AllreduceRing>>("gloo_AllreduceRing"),
      factory<ClassicAllreduce<gloo::AllreduceRingChunked>>("gloo_AllreduceRingChunked"),
      factory<ClassicAllreduce<gloo::AllreduceHalvingDoubling>>("gloo_AllreduceHalvingDoubling"),
      factory<UnboundAllreduce<gloo::AllreduceOptions::Algorithm::RING>>("gloo_allreduce_api"),
      factory<UnboundAllreduce<gloo::AllreduceOptions::Algorithm::BCUBE>>(
          "gloo_allreduce_api_bcube"),
  };
}

}  // namespace ddp::bench
