#include "comm/collectives/collectives.h"

#include <cstring>

#include "comm/collectives/barrier.h"
#include "comm/collectives/broadcast.h"
#include "comm/collectives/direct.h"
#include "comm/collectives/op_scope.h"
#include "comm/collectives/recursive_doubling.h"
#include "comm/collectives/ring.h"
#include "comm/reduce_kernels.h"

namespace ddp::detail::collectives {
AllreduceAlgorithm choose_allreduce(const PeerTransport& transport, std::size_t bytes,
                                    std::size_t count, const AlgorithmConfig& config) {
  const int ranks = transport.size();
  const bool fits_round = bytes <= transport.round_payload_bytes();
  switch (config.allreduce) {
    case AllreduceAlgorithm::kDirect:
      if (fits_round) return AllreduceAlgorithm::kDirect;
      break;  // auto's choice among the others
    case AllreduceAlgorithm::kRing:
    case AllreduceAlgorithm::kRecursiveDoubling:
      return config.allreduce;
    case AllreduceAlgorithm::kAuto:
      if (takes_direct(transport, bytes, config)) return AllreduceAlgorithm::kDirect;
      break;
  }
  // Two ranks may exchange the whole buffer instead, where one message carries it.
  const bool two_exchange =
      ranks == 2 && !config.ring_for_two_ranks && bytes <= transport.max_message_bytes();
  const bool ring_pays = bytes >= config.ring_threshold_bytes &&
                         count >= static_cast<std::size_t>(ranks) && !two_exchange;
  return ring_pays ? AllreduceAlgorithm::kRing : AllreduceAlgorithm::kRecursiveDoubling;
}

void allreduce(PeerTransport& transport, Buffer buffer, ReduceOp op,
               const AlgorithmConfig& config) {
  const int n = transport.size();
  if (n == 1) return;
  OpScope scope(transport, CollectiveKind::kAllreduce, buffer, config,
                static_cast<std::uint32_t>(op));
  allreduce_in_op(transport, buffer, Reduction(buffer.dtype, op, n), config);
  scope.finish();
}

void allreduce_in_op(PeerTransport& transport, Buffer buffer, const Reduction& reduction,
                     const AlgorithmConfig& config) {
  const int n = transport.size();
  const auto algorithm = choose_allreduce(transport, buffer.bytes(), buffer.count, config);
  constexpr auto kDirect = flight::name_code("direct");
  constexpr auto kRing = flight::name_code("ring");
  constexpr auto kDoubling = flight::name_code("doubling");
  flight::Recorder::note_algorithm(algorithm == AllreduceAlgorithm::kDirect ? kDirect
                                   : algorithm == AllreduceAlgorithm::kRing ? kRing
                                                                            : kDoubling);
  if (algorithm == AllreduceAlgorithm::kDirect)
    return allreduce_direct(transport, buffer, reduction);
  if (buffer.count == 0) return barrier_in_op(transport, config);
  if (algorithm == AllreduceAlgorithm::kRing) {
    const auto layout =
        ring_layout(buffer.count, buffer.dtype, n, config, transport.max_message_bytes());
    transport.expose(buffer.data, buffer.bytes());
    char* slots = static_cast<char*>(transport.scratch(layout.slot_bytes(config)));
    run_ring(transport, buffer, RingPhases::kBoth, &reduction, layout, config, slots);
  } else {
    allreduce_recursive_doubling(transport, buffer, reduction);
  }
}

void broadcast(PeerTransport& transport, Buffer buffer, int root, const AlgorithmConfig& config) {
  const int n = transport.size();
  if (n == 1) return;
  OpScope scope(transport, CollectiveKind::kBroadcast, buffer, config,
                static_cast<std::uint32_t>(root));
  broadcast_in_op(transport, buffer, root, config);
  scope.finish();
}

void broadcast_in_op(PeerTransport& transport, Buffer buffer, int root,
                     const AlgorithmConfig& config) {
  if (takes_direct(transport, buffer.bytes(), config)) {
    broadcast_direct(transport, buffer, root);
  } else if (buffer.count == 0) {
    barrier_in_op(transport, config);
  } else if (buffer.bytes() < config.ring_threshold_bytes) {
    broadcast_binomial_tree(transport, buffer, root);
  } else {
    transport.expose(buffer.data, buffer.bytes());
    broadcast_pipelined_chain(transport, buffer, root, config);
  }
}

void allgather(PeerTransport& transport, Buffer input, Buffer output,
               const AlgorithmConfig& config) {
  if (transport.size() == 1) {
    if (input.count > 0 && output.data != input.data) {
      std::memmove(output.data, input.data, input.bytes());
    }
    return;
  }
  OpScope scope(transport, CollectiveKind::kAllgather, input, config);
  allgather_in_op(transport, input, output, config);
  scope.finish();
}

void allgather_in_op(PeerTransport& transport, Buffer input, Buffer output,
                     const AlgorithmConfig& config) {
  const int n = transport.size();
  char* own =
      static_cast<char*>(output.data) + input.bytes() * static_cast<std::size_t>(transport.rank());
  if (input.count > 0 && own != input.data) std::memmove(own, input.data, input.bytes());
  if (takes_direct(transport, input.bytes(), config))
    return allgather_direct(transport, input, output);
  if (input.count == 0) return barrier_in_op(transport, config);
  const auto layout =
      ring_layout(output.count, output.dtype, n, config, transport.max_message_bytes());
  transport.expose(output.data, output.bytes());
  run_ring(transport, output, RingPhases::kAllgather, nullptr, layout, config, nullptr);
}

void reduce_scatter(PeerTransport& transport, Buffer input, Buffer output, ReduceOp op,
                    const AlgorithmConfig& config) {
  const int n = transport.size();
  if (n == 1) {
    if (output.count > 0 && output.data != input.data) {
      std::memmove(output.data, input.data, output.bytes());
    }
    return;
  }
  OpScope scope(transport, CollectiveKind::kReduceScatter, output, config,
                static_cast<std::uint32_t>(op));
  reduce_scatter_in_op(transport, input, output, Reduction(input.dtype, op, n), config);
  scope.finish();
}

void reduce_scatter_in_op(PeerTransport& transport, Buffer input, Buffer output,
                          const Reduction& reduction, const AlgorithmConfig& config) {
  const int r = transport.rank();
  if (takes_direct(transport, input.bytes(), config)) {
    return reduce_scatter_direct(transport, input, output, reduction);
  }
  if (output.count == 0) return barrier_in_op(transport, config);
  // The ring reduces in place; work on a copy so the caller's input stays untouched.
  const auto layout = ring_layout(input.count, input.dtype, transport.size(), config,
                                  transport.max_message_bytes());
  const std::size_t work_bytes = (input.bytes() + 63) / 64 * 64;
  char* work = static_cast<char*>(transport.scratch(work_bytes + layout.slot_bytes(config)));
  std::memcpy(work, input.data, input.bytes());
  Buffer whole(work, input.count, input.dtype);
  run_ring(transport, whole, RingPhases::kReduceScatter, &reduction, layout, config,
           work + work_bytes);
  std::memcpy(output.data, work + output.bytes() * static_cast<std::size_t>(r), output.bytes());
}

void barrier(PeerTransport& transport, const AlgorithmConfig& config) {
  if (transport.size() == 1) return;
  OpScope scope(transport, CollectiveKind::kBarrier, Buffer(), config);
  barrier_in_op(transport, config);
  scope.finish();
}

void barrier_in_op(PeerTransport& transport, const AlgorithmConfig& config) {
  if (config.direct_bytes > 0) return barrier_direct(transport);
  barrier_dissemination(transport);
}

}  // namespace ddp::detail::collectives
