#include "comm/fabric/fabric_communicator.h"

#include "comm/collectives/collectives.h"
#include "comm/collectives/hierarchical.h"
#include "comm/fabric/fabric_connection.h"
#include "comm/fabric/fabric_transport.h"
#include "ddp/error.h"
#include "ddp/log.h"

namespace ddp::detail {

FabricCommunicator::FabricCommunicator(std::shared_ptr<Store> store, int rank, int size,
                                       const CommOptions& options)
    : Communicator(rank, size, options) {
  auto connection = fabric::connect_fabric(*store, rank, size, options.timeout);
  provider_ = std::move(connection.provider);
  config_ = connection.config;
  transport_ = std::move(connection.transport);

  Topology topology = exchange_topology(*store, rank, size);
  const auto decision =
      collectives::decide_hierarchy(topology, collectives::collectives_mode_from_env());
  if (decision.hierarchical) {
    auto local_store = store->with_prefix("node" + std::to_string(topology.node()));
    auto local =
        fabric::connect_fabric(*local_store, topology.local_rank(), topology.local_size(),
                               options.timeout, "inside node " + std::to_string(topology.node()));
    local_ = {std::move(local.transport), local.config, local.provider};
    auto cross_store = store->with_prefix("local" + std::to_string(topology.local_rank()));
    auto cross = fabric::connect_fabric(
        *cross_store, topology.node(), topology.nodes(), options.timeout,
        "between nodes, local rank " + std::to_string(topology.local_rank()));
    cross_ = {std::move(cross.transport), cross.config, cross.provider};
  }
  announce_topology(std::move(topology), decision.hierarchical,
                    collectives::describe(decision, local_.provider, cross_.provider),
                    decision.fell_back);
}

FabricCommunicator::~FabricCommunicator() {
  shutdown();
  cross_.transport.reset();
  local_.transport.reset();
  transport_.reset();
}

template <typename Fn>
void FabricCommunicator::guarded(Fn&& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    for (auto* transport : {transport_.get(), local_.transport.get(), cross_.transport.get()}) {
      if (transport) transport->abort(e.what());
    }
    throw;
  }
}

collectives::Hierarchy FabricCommunicator::levels() const {
  return {*local_.transport, *cross_.transport, local_.config, cross_.config};
}

void FabricCommunicator::do_allreduce(Buffer buffer, ReduceOp op) {
  guarded([&] {
    if (hierarchical()) return collectives::allreduce_hierarchical(levels(), buffer, op);
    collectives::allreduce(*transport_, buffer, op, config_);
  });
}

void FabricCommunicator::do_broadcast(Buffer buffer, int root) {
  guarded([&] {
    if (hierarchical()) {
      return collectives::broadcast_hierarchical(levels(), buffer, topology().node_of(root),
                                                 topology().local_rank_of(root));
    }
    collectives::broadcast(*transport_, buffer, root, config_);
  });
}

void FabricCommunicator::do_allgather(Buffer input, Buffer output) {
  guarded([&] { collectives::allgather(*transport_, input, output, config_); });
}

void FabricCommunicator::do_reduce_scatter(Buffer input, Buffer output, ReduceOp op) {
  guarded([&] { collectives::reduce_scatter(*transport_, input, output, op, config_); });
}

void FabricCommunicator::do_barrier() {
  guarded([&] {
    if (hierarchical()) return collectives::barrier_hierarchical(levels());
    collectives::barrier(*transport_);
  });
}

}  // namespace ddp::detail
