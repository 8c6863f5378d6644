#pragma once
// The Gloo-over-TCP backend: gloo's transport and collectives on a full mesh of TCP pairs.
// Every collective starts with a direct exchange of its signature among all ranks (see
// GlooDirectExchange): small collectives travel inside that single exchange; large ones then
// run gloo's bandwidth-optimal algorithms.
#include <cstdint>
#include <memory>
#include <string>

#include "comm/collective_signature.h"
#include "comm/gloo/gloo_direct_exchange.h"
#include "ddp/comm/communicator.h"
#include "ddp/store.h"

namespace gloo::rendezvous {
class Context;
}

namespace ddp::detail {

enum class GlooAllreduceAlgorithm {
  kAuto,    // by size, see choose_allreduce_algorithm
  kDirect,  // one exchange of the data with every peer, reduced locally in rank order
  kRing,    // gloo::allreduce, ring (bandwidth-optimal, segment pipelined)
  kBcube,   // gloo::allreduce, bcube
};

// DDP_GLOO_ALGORITHM=auto|direct|ring|bcube (default auto).
GlooAllreduceAlgorithm gloo_algorithm_from_env();
const char* to_string(GlooAllreduceAlgorithm algorithm);

class GlooCommunicator final : public Communicator {
 public:
  GlooCommunicator(std::shared_ptr<Store> store, int rank, int size, const CommOptions& options);
  ~GlooCommunicator() override;

  const char* backend_name() const override { return "gloo"; }

  // The algorithm used for an allreduce of `bytes` of `dtype` (after any DDP_GLOO_ALGORITHM).
  GlooAllreduceAlgorithm choose_allreduce_algorithm(std::size_t bytes, DataType dtype) const;

 protected:
  void do_allreduce(Buffer buffer, ReduceOp op) override;
  void do_broadcast(Buffer buffer, int root) override;
  void do_allgather(Buffer input, Buffer output) override;
  void do_reduce_scatter(Buffer input, Buffer output, ReduceOp op) override;
  void do_barrier() override;

 private:
  // Runs one gloo call, turning its exceptions into CommError/TimeoutError and remembering the
  // first failure: after it the mesh is unusable and later calls fail at once.
  template <typename Fn>
  void guarded(const char* op, Fn&& fn);

  // Agrees on the collective with every peer, carrying `payload` along when given.
  void exchange(CollectiveKind kind, const Buffer& buffer, std::uint32_t detail,
                const void* payload, std::size_t payload_bytes);
  void gloo_allreduce(Buffer buffer, ReduceOp op, GlooAllreduceAlgorithm algorithm);
  // Reduces every rank's exchanged payload, in rank order, into `out`.
  void reduce_exchanged(Buffer out, ReduceOp op) const;

  std::shared_ptr<gloo::rendezvous::Context> context_;
  std::unique_ptr<GlooDirectExchange> exchange_;
  GlooAllreduceAlgorithm forced_algorithm_;
  std::uint64_t sequence_ = 0;
  std::string failure_;
};

}  // namespace ddp::detail
