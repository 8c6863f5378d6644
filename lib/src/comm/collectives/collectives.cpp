#include "comm/collectives/collectives.h"

#include <cstring>

#include "comm/collectives/barrier.h"
#include "comm/collectives/broadcast.h"
#include "comm/collectives/op_scope.h"
#include "comm/collectives/recursive_doubling.h"
#include "comm/collectives/ring.h"
#include "comm/reduce_kernels.h"

namespace ddp::detail::collectives {
AllreduceAlgorithm choose_allreduce(std::size_t bytes, std::size_t count, int ranks,
                                    const AlgorithmConfig& config) {
  if (config.allreduce != AllreduceAlgorithm::kAuto) return config.allreduce;
  const bool ring_pays =
      bytes >= config.ring_threshold_bytes && count >= static_cast<std::size_t>(ranks);
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
  if (buffer.count == 0) {
    barrier_dissemination(transport);
    return;
  }
  if (choose_allreduce(buffer.bytes(), buffer.count, n, config) == AllreduceAlgorithm::kRing) {
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
  if (buffer.count == 0) {
    barrier_dissemination(transport);
  } else if (buffer.bytes() < config.ring_threshold_bytes) {
    broadcast_binomial_tree(transport, buffer, root);
  } else {
    transport.expose(buffer.data, buffer.bytes());
    broadcast_pipelined_chain(transport, buffer, root, config);
  }
}

void allgather(PeerTransport& transport, Buffer input, Buffer output,
               const AlgorithmConfig& config) {
  const int n = transport.size();
  const int r = transport.rank();
  char* own = static_cast<char*>(output.data) + input.bytes() * static_cast<std::size_t>(r);
  if (input.count > 0 && own != input.data) std::memmove(own, input.data, input.bytes());
  if (n == 1) return;
  OpScope scope(transport, CollectiveKind::kAllgather, input, config);
  if (input.count == 0) {
    barrier_dissemination(transport);
    return scope.finish();
  }
  const auto layout =
      ring_layout(output.count, output.dtype, n, config, transport.max_message_bytes());
  transport.expose(output.data, output.bytes());
  run_ring(transport, output, RingPhases::kAllgather, nullptr, layout, config, nullptr);
  scope.finish();
}

void reduce_scatter(PeerTransport& transport, Buffer input, Buffer output, ReduceOp op,
                    const AlgorithmConfig& config) {
  const int n = transport.size();
  const int r = transport.rank();
  if (n == 1) {
    if (output.count > 0 && output.data != input.data) {
      std::memmove(output.data, input.data, output.bytes());
    }
    return;
  }
  OpScope scope(transport, CollectiveKind::kReduceScatter, output, config,
                static_cast<std::uint32_t>(op));
  if (output.count == 0) {
    barrier_dissemination(transport);
    return scope.finish();
  }
  // The ring reduces in place; work on a copy so the caller's input stays untouched.
  const auto layout =
      ring_layout(input.count, input.dtype, n, config, transport.max_message_bytes());
  const std::size_t work_bytes = (input.bytes() + 63) / 64 * 64;
  char* work = static_cast<char*>(transport.scratch(work_bytes + layout.slot_bytes(config)));
  std::memcpy(work, input.data, input.bytes());
  Buffer whole(work, input.count, input.dtype);
  const Reduction reduction(input.dtype, op, n);
  run_ring(transport, whole, RingPhases::kReduceScatter, &reduction, layout, config,
           work + work_bytes);
  scope.finish();
  std::memcpy(output.data, work + output.bytes() * static_cast<std::size_t>(r), output.bytes());
}

void barrier(PeerTransport& transport) {
  if (transport.size() == 1) return;
  OpScope scope(transport, CollectiveKind::kBarrier, Buffer(), AlgorithmConfig{});
  barrier_dissemination(transport);
  scope.finish();
}

}  // namespace ddp::detail::collectives
