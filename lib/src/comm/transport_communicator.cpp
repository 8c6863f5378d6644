#include "comm/transport_communicator.h"

#include "comm/collectives/collectives.h"
#include "ddp/log.h"

namespace ddp::detail {
namespace {
constexpr auto kTwoLevel = flight::name_code("2-level");
}  // namespace

TransportCommunicator::TransportCommunicator(int rank, int size, const CommOptions& options)
    : Communicator(rank, size, options) {}

TransportCommunicator::~TransportCommunicator() {
  // The op queue's thread may be inside a collective on these transports (the backend's
  // destructor has stopped it already).
  shutdown();
  cross_.transport.reset();
  local_.transport.reset();
  job_.transport.reset();
}

void TransportCommunicator::connect(const std::shared_ptr<Store>& store,
                                    const ConnectLevel& connect_level,
                                    const ConnectLevel& connect_node) {
  job_ = connect_level(store, rank(), size(), "");
  Topology topology = exchange_topology(*store, rank(), size());
  // Two ranks of one node keep the ring, whose chunks overlap the copy with the reduction: on
  // gloo's loopback pairs the whole-buffer exchange was 1.3 times slower at 1 MiB
  // (bench/results/2026-11-29-two-rank-doubling.txt). Every rank sees the same topology.
  if (topology.nodes() == 1) job_.config.ring_for_two_ranks = true;
  const auto decision =
      collectives::decide_hierarchy(topology, collectives::collectives_mode(options()));
  if (decision.hierarchical) {
    const std::string node = std::to_string(topology.node());
    local_ = connect_node(store->with_prefix("node" + node), topology.local_rank(),
                          topology.local_size(), "inside node " + node);
    local_.transport->set_global_ranks(topology.members(topology.node()));
    const std::string local_rank = std::to_string(topology.local_rank());
    cross_ = connect_level(store->with_prefix("local" + local_rank), topology.node(),
                           topology.nodes(), "between nodes, local rank " + local_rank);
    std::vector<int> cross_ranks;
    for (int n = 0; n < topology.nodes(); ++n) {
      cross_ranks.push_back(topology.members(n)[static_cast<std::size_t>(topology.local_rank())]);
    }
    cross_.transport->set_global_ranks(std::move(cross_ranks));
  }
  announce_topology(std::move(topology), decision.hierarchical,
                    collectives::describe(decision, local_.provider, cross_.provider),
                    decision.fell_back);
}

collectives::AllreduceAlgorithm TransportCommunicator::allreduce_algorithm(
    std::size_t bytes, std::size_t count) const {
  return collectives::choose_allreduce(*job_.transport, bytes, count, job_.config);
}

template <typename Fn>
void TransportCommunicator::guarded(Fn&& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    for (Level* level : {&job_, &local_, &cross_}) {
      if (level->transport) level->transport->abort(e.what());
    }
    throw;
  }
}

collectives::Hierarchy TransportCommunicator::levels() const {
  return {*local_.transport, *cross_.transport, local_.config, cross_.config};
}

void TransportCommunicator::do_allreduce(Buffer buffer, ReduceOp op) {
  guarded([&] {
    if (hierarchical()) {
      flight::Recorder::note_algorithm(kTwoLevel);
      return collectives::allreduce_hierarchical(levels(), buffer, op);
    }
    collectives::allreduce(*job_.transport, buffer, op, job_.config);
  });
}

void TransportCommunicator::do_broadcast(Buffer buffer, int root) {
  guarded([&] {
    if (hierarchical()) {
      return collectives::broadcast_hierarchical(levels(), buffer, topology().node_of(root),
                                                 topology().local_rank_of(root));
    }
    collectives::broadcast(*job_.transport, buffer, root, job_.config);
  });
}

void TransportCommunicator::do_allgather(Buffer input, Buffer output) {
  guarded([&] {
    if (hierarchical() && collectives::gathers_hierarchically(levels(), output.bytes())) {
      flight::Recorder::note_algorithm(kTwoLevel);
      return collectives::allgather_hierarchical(levels(), topology(), input, output);
    }
    collectives::allgather(*job_.transport, input, output, job_.config);
  });
}

void TransportCommunicator::do_reduce_scatter(Buffer input, Buffer output, ReduceOp op) {
  guarded([&] {
    if (hierarchical() && collectives::gathers_hierarchically(levels(), input.bytes())) {
      flight::Recorder::note_algorithm(kTwoLevel);
      return collectives::reduce_scatter_hierarchical(levels(), topology(), input, output, op);
    }
    collectives::reduce_scatter(*job_.transport, input, output, op, job_.config);
  });
}

void TransportCommunicator::do_barrier() {
  guarded([&] {
    if (hierarchical()) return collectives::barrier_hierarchical(levels());
    collectives::barrier(*job_.transport, job_.config);
  });
}

}  // namespace ddp::detail
