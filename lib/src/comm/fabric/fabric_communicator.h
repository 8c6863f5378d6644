#pragma once
// The libfabric backend (DDP_BACKEND=fabric): collectives over an RDM endpoint of the provider
// chosen for the job (efa on AWS, shm within one host, tcp;ofi_rxm otherwise). Addresses are
// exchanged through the rendezvous store; the algorithms live in collectives.h and run over a
// FabricTransport. When the ranks span several nodes of several ranks each (see
// decide_hierarchy), two more endpoints join the ranks of this node (shm) and the ranks with this
// local index on every node (efa or tcp), and allreduce, broadcast and barrier run the
// hierarchical collectives over them. This header stays free of libfabric's own headers.
#include <memory>
#include <string>

#include "comm/collectives/algorithm_config.h"
#include "ddp/comm/communicator.h"
#include "ddp/store.h"

namespace ddp::detail {

namespace fabric {
class FabricTransport;
}
namespace collectives {
struct Hierarchy;
}

class FabricCommunicator final : public Communicator {
 public:
  // Opens the endpoint and exchanges addresses through `store`. It does not wait for a first
  // exchange over the fabric: a rank that is slow to start must not see its construction fail
  // because faster ranks already failed a collective; that collective's error reaches it instead.
  FabricCommunicator(std::shared_ptr<Store> store, int rank, int size, const CommOptions& options);
  ~FabricCommunicator() override;

  const char* backend_name() const override { return "fabric"; }
  // The libfabric provider in use, e.g. "shm" or "tcp;ofi_rxm".
  const std::string& provider() const { return provider_; }
  const collectives::AlgorithmConfig& algorithm_config() const { return config_; }

 protected:
  void do_allreduce(Buffer buffer, ReduceOp op) override;
  void do_broadcast(Buffer buffer, int root) override;
  void do_allgather(Buffer input, Buffer output) override;
  void do_reduce_scatter(Buffer input, Buffer output, ReduceOp op) override;
  void do_barrier() override;

 private:
  struct Level {
    std::unique_ptr<fabric::FabricTransport> transport;
    collectives::AlgorithmConfig config;
    std::string provider;
  };
  // Runs a collective; when it fails on one endpoint, aborts the others, so that the peers that
  // would wait on this rank there fail now instead of at their timeout.
  template <typename Fn>
  void guarded(Fn&& fn);
  collectives::Hierarchy levels() const;

  collectives::AlgorithmConfig config_;
  std::string provider_;
  std::unique_ptr<fabric::FabricTransport> transport_;
  Level local_;  // this node's ranks; null transports when the collectives are flat
  Level cross_;  // the ranks with this local index
};

}  // namespace ddp::detail
