#include <cstdlib>

#include "allreduce_variants.h"
#include "ddp/comm/factory.h"

namespace ddp::bench {
namespace {

class DdpAllreduce final : public AllreduceVariant {
 public:
  DdpAllreduce(std::unique_ptr<Communicator> comm, ReduceOp op, DataType dtype)
      : comm_(std::move(comm)), op_(op), dtype_(dtype) {}
  void prepare(float* data, std::size_t count) override {
    buffer_ = Buffer(data, count * sizeof(float) / element_size(dtype_), dtype_);
  }
  void run() override { comm_->allreduce(buffer_, op_); }

 private:
  std::unique_ptr<Communicator> comm_;
  ReduceOp op_;
  DataType dtype_;
  Buffer buffer_;
};

}  // namespace

VariantFactory ddp_variant(const std::string& name, const std::string& backend,
                           std::vector<std::pair<std::string, std::string>> env, ReduceOp op,
                           DataType dtype) {
  return {name, [backend, env, op, dtype](std::shared_ptr<Store> store, int rank, int size) {
            for (const auto& [key, value] : env) setenv(key.c_str(), value.c_str(), 1);
            auto comm = create_communicator(backend, store, rank, size);
            for (const auto& [key, value] : env) unsetenv(key.c_str());
            return std::unique_ptr<AllreduceVariant>(new DdpAllreduce(std::move(comm), op, dtype));
          }};
}

}  // namespace ddp::bench
