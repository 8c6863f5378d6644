#pragma once
// The Gloo-over-TCP backend: gloo's collectives on a full mesh of TCP pairs. The allreduce
// algorithm is chosen per call by message size (see choose_allreduce_algorithm), since no single
// gloo algorithm is best from 4 KiB to 64 MiB.
#include <list>
#include <memory>
#include <string>

#include "ddp/comm/communicator.h"
#include "ddp/store.h"

namespace gloo {
class Algorithm;
namespace rendezvous {
class Context;
}
}  // namespace gloo

namespace ddp::detail {

enum class GlooAllreduceAlgorithm {
  kAuto,             // by size, see choose_allreduce_algorithm
  kRing,             // gloo::allreduce, ring (bandwidth-optimal, segment pipelined)
  kBcube,            // gloo::allreduce, bcube
  kClassicRing,      // gloo::AllreduceRing (cached per buffer; lowest latency when small)
  kHalvingDoubling,  // gloo::AllreduceHalvingDoubling (cached per buffer)
};

// DDP_GLOO_ALGORITHM=auto|ring|bcube|classic_ring|halving_doubling (default auto).
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

  void allreduce_unbound(Buffer buffer, ReduceOp op, GlooAllreduceAlgorithm algorithm);
  void allreduce_classic(Buffer buffer, ReduceOp op, GlooAllreduceAlgorithm algorithm);

  struct CachedAlgorithm {
    void* data;
    std::size_t count;
    DataType dtype;
    ReduceOp op;
    GlooAllreduceAlgorithm algorithm;
    std::unique_ptr<gloo::Algorithm> instance;
  };

  std::shared_ptr<gloo::rendezvous::Context> context_;
  GlooAllreduceAlgorithm forced_algorithm_;
  // Classic gloo algorithms bind to one buffer and cost a handshake to build: keep the most
  // recently used ones (DDP reuses its bucket buffers every step). Eviction is deterministic,
  // so every rank keeps the same set.
  std::list<CachedAlgorithm> classic_cache_;
  std::string failure_;
};

}  // namespace ddp::detail
