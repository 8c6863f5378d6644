#pragma once
// The allreduce implementations the benchmark compares, behind one interface: ddp's
// communicators and the reference lines (raw gloo algorithms, libtorch's ProcessGroupGloo).
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ddp/comm/types.h"
#include "ddp/store.h"

namespace ddp::bench {

// Sums `count` floats in place across all ranks.
class AllreduceVariant {
 public:
  virtual ~AllreduceVariant() = default;
  virtual void prepare(float* data, std::size_t count) = 0;  // once per size, outside timing
  virtual void run() = 0;
};

struct VariantFactory {
  std::string name;
  std::function<std::unique_ptr<AllreduceVariant>(std::shared_ptr<Store>, int rank, int size)> make;
};

// ddp's communicator of `backend`, after setting `env` (e.g. DDP_ALGORITHM=ring), running
// `op` (kSum like the references; kAvg is what DDP runs on its buckets) on the same bytes as
// elements of `dtype` (kBFloat16: what DDP's bf16 gradient compression sends).
VariantFactory ddp_variant(const std::string& name, const std::string& backend,
                           std::vector<std::pair<std::string, std::string>> env = {},
                           ReduceOp op = ReduceOp::kSum, DataType dtype = DataType::kFloat32);

// Raw gloo: classic AllreduceRing / AllreduceRingChunked / AllreduceHalvingDoubling
// (constructed once per buffer, as c10d caches them) and the gloo::allreduce API (ring).
std::vector<VariantFactory> raw_gloo_variants();

// libtorch's c10d::ProcessGroupGloo, as PyTorch DDP uses it.
VariantFactory c10d_gloo_variant();

}  // namespace ddp::bench
