#pragma once
// The Gloo-over-TCP backend: gloo's rendezvous and TCP transport, two full meshes of pairs.
// Every collective sends its signature to every peer in a direct exchange (see
// GlooDirectExchange), which has a mesh of its own. Payloads up to 64 KiB travel inside that
// exchange, payloads up to a budget beside it on the other mesh (GlooPayloadExchange); larger
// ones run the shared collectives (the fabric backend's ring, chain and so on) over the other
// mesh, with the signatures checked at their first wait (see GlooPeerTransport).
#include <cstdint>
#include <memory>
#include <string>

#include "comm/collective_signature.h"
#include "comm/collectives/algorithm_config.h"
#include "comm/collectives/hierarchical.h"
#include "comm/gloo/gloo_direct_exchange.h"
#include "comm/gloo/gloo_fwd.h"
#include "comm/gloo/gloo_payload_exchange.h"
#include "comm/gloo/gloo_peer_transport.h"
#include "ddp/comm/communicator.h"
#include "ddp/store.h"

namespace ddp::detail {

enum class GlooAllreduceAlgorithm {
  kAuto,      // direct below 1 MiB sent per rank, else ring
  kDirect,    // the same (ranks with auto and direct must agree)
  kRing,      // the shared pipelined ring over gloo's pairs, at every size
  kGlooRing,  // gloo::allreduce's ring, at every size
  kBcube,     // gloo::allreduce's bcube, at every size
};

// DDP_GLOO_ALGORITHM=auto|direct|ring|gloo_ring|bcube (default auto).
GlooAllreduceAlgorithm gloo_algorithm_from_env();
const char* to_string(GlooAllreduceAlgorithm algorithm);

class GlooCommunicator final : public Communicator {
 public:
  GlooCommunicator(std::shared_ptr<Store> store, int rank, int size, const CommOptions& options);
  ~GlooCommunicator() override;

  const char* backend_name() const override { return "gloo"; }

  // The algorithm used for an allreduce of `bytes` (after any DDP_GLOO_ALGORITHM).
  GlooAllreduceAlgorithm choose_allreduce_algorithm(std::size_t bytes) const;

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
  // guarded() that also poisons the meshes on any failure: the failed op may still have
  // messages in flight into the caller's memory, and the exchange's streams are out of step.
  template <typename Fn>
  void collective(const char* op, Fn&& fn);
  // Remembers `cause` and closes every connection: nothing can land in memory this rank no
  // longer lends to the op, and the peers fail at once instead of at their timeout.
  void poison(const std::string& cause);

  using SendFrom = GlooPayloadExchange::SendFrom;
  // Agrees on the collective with every peer, carrying `payload` along when given (up to
  // direct_budget_ bytes): in the direct exchange itself when the largest payload of any rank
  // fits it, else on the payload exchange, sent `from` where the caller says.
  // exchanged_payload() then finds each rank's payload.
  void exchange(CollectiveKind kind, const Buffer& buffer, std::uint32_t detail,
                const void* payload, std::size_t payload_bytes, std::size_t largest_payload_bytes,
                SendFrom from);
  void exchange(CollectiveKind kind, const Buffer& buffer, std::uint32_t detail,
                const void* payload, std::size_t payload_bytes, SendFrom from) {
    exchange(kind, buffer, detail, payload, payload_bytes, payload_bytes, from);
  }
  const void* exchanged_payload(int peer) const;
  // The two levels of the hierarchical collectives: the ranks of this node, and the ranks with
  // this local index on every node. Between nodes, and inside them where libddp_fabric cannot be
  // loaded, a level is a gloo mesh with a direct exchange of its own (which carries its
  // signatures) and a GlooPeerTransport over it; inside nodes it is otherwise libddp_fabric's
  // shared memory transport, with no mesh.
  struct Level {
    std::shared_ptr<gloo::rendezvous::Context> mesh;
    std::shared_ptr<gloo::rendezvous::Context> exchange_mesh;
    std::unique_ptr<GlooDirectExchange> exchange;           // null on libddp_fabric's transport
    std::unique_ptr<collectives::PeerTransport> transport;  // null when the collectives are flat
    collectives::AlgorithmConfig config;
    std::string provider;  // for the log: "gloo's TCP pairs" or libfabric's provider
  };
  Level connect_level(const std::shared_ptr<Store>& store,
                      const std::shared_ptr<gloo::transport::Device>& device, int rank, int size);
  // The node's level over libddp_fabric when it loads, else connect_level's.
  Level connect_node_level(const std::shared_ptr<Store>& store,
                           const std::shared_ptr<gloo::transport::Device>& device,
                           const Topology& topology);
  collectives::Hierarchy levels() const;
  // A hierarchical allreduce of up to GlooDirectExchange::kMaxPayloadBytes: each level's direct
  // exchange carries the whole buffer, one round inside the node and one between nodes (the L
  // ranks of a node each with its counterparts, in parallel). The levels' transports would take
  // several messages per step, each a wake-up of gloo's device thread.
  void allreduce_by_direct_levels(Buffer buffer, ReduceOp op);
  void gloo_allreduce(Buffer buffer, ReduceOp op, GlooAllreduceAlgorithm algorithm);
  // Reduces every rank's exchanged payload, in rank order, into `out`.
  void reduce_exchanged(Buffer out, ReduceOp op) const;

  std::shared_ptr<gloo::rendezvous::Context> context_;        // the shared collectives' mesh
  std::shared_ptr<gloo::rendezvous::Context> exchange_mesh_;  // the direct exchange's own
  std::size_t direct_budget_;        // payload bytes that travel inside the direct exchange
  std::size_t allreduce_ring_from_;  // allreduce payloads from this size take the ring
  std::unique_ptr<GlooDirectExchange> exchange_;
  std::unique_ptr<GlooPayloadExchange> payloads_;  // null when the budget fits the exchange
  bool payload_in_exchange_ = true;                // where the last exchange() carried its payload
  std::unique_ptr<GlooPeerTransport> transport_;
  GlooAllreduceAlgorithm forced_algorithm_;
  collectives::AlgorithmConfig collectives_config_;
  Level local_;
  Level cross_;
  std::string failure_;
};

}  // namespace ddp::detail
