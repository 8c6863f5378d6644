#pragma once
// A Communicator whose collectives run the shared algorithms (collectives/) over transports a
// backend connects: one over the whole job and, where the ranks span several nodes of several
// ranks each (decide_hierarchy), one over this node's ranks and one over the ranks with this
// local index on every node. A backend is its constructor: it connects the transports and calls
// connected(); everything after that is here, the same for every backend.
#include <functional>
#include <memory>
#include <string>

#include "comm/collectives/algorithm_config.h"
#include "comm/collectives/hierarchical.h"
#include "comm/collectives/peer_transport.h"
#include "ddp/comm/communicator.h"
#include "ddp/store.h"

namespace ddp::detail {

class TransportCommunicator : public Communicator {
 public:
  // Backends call shutdown() in their own destructor first; this one repeats it (harmless) and
  // then closes the levels.
  ~TransportCommunicator() override;

  // The job level's algorithm settings and transport, e.g. "shm" or "gloo's TCP pairs".
  const collectives::AlgorithmConfig& algorithm_config() const { return job_.config; }
  const std::string& provider() const { return job_.provider; }
  // The algorithm a flat allreduce of `count` elements in `bytes` takes on the job's level.
  collectives::AllreduceAlgorithm allreduce_algorithm(std::size_t bytes, std::size_t count) const;

 protected:
  struct Level {
    std::unique_ptr<collectives::PeerTransport> transport;  // null: the level is not in use
    collectives::AlgorithmConfig config;
    std::string provider;  // for the log: libfabric's provider, or "gloo's TCP pairs"
  };
  // Connects a level over `store` for `rank` of `size`; `group` names it in the log ("" for the
  // job's).
  using ConnectLevel = std::function<Level(const std::shared_ptr<Store>& store, int rank, int size,
                                           const std::string& group)>;

  TransportCommunicator(int rank, int size, const CommOptions& options);

  // Connects the job's level, learns the topology, decides between flat and hierarchical
  // collectives and connects the node's and the cross-node levels when hierarchical; logs the
  // outcome once (rank 0). `connect_node` serves the node's level (it may differ: shared memory).
  void connect(const std::shared_ptr<Store>& store, const ConnectLevel& connect_level,
               const ConnectLevel& connect_node);

  void do_allreduce(Buffer buffer, ReduceOp op) final;
  void do_broadcast(Buffer buffer, int root) final;
  void do_allgather(Buffer input, Buffer output) final;
  void do_reduce_scatter(Buffer input, Buffer output, ReduceOp op) final;
  void do_barrier() final;

 private:
  // Runs a collective; when it fails on one level, aborts every level, so that no request
  // touches caller memory after the failure and the peers that would wait on this rank fail now
  // instead of at their timeout.
  template <typename Fn>
  void guarded(Fn&& fn);
  collectives::Hierarchy levels() const;

  Level job_;
  Level local_;  // this node's ranks; no transport when the collectives are flat
  Level cross_;  // the ranks with this local index
};

}  // namespace ddp::detail
