#pragma once
// Collectives written against PeerTransport only, for any backend: each call brackets one
// op (begin_op/end_op), picks the algorithm for the payload and runs it. Arguments have been
// validated by Communicator; here every rank still checks the others' through the op header.
#include "comm/collectives/algorithm_config.h"
#include "comm/collectives/peer_transport.h"
#include "comm/reduce_kernels.h"
#include "ddp/comm/types.h"

namespace ddp::detail::collectives {

// The allreduce algorithm `config` picks for a payload of `bytes` and `count` elements on
// `transport` (kDirect where one round carries it and pays, direct.h).
AllreduceAlgorithm choose_allreduce(const PeerTransport& transport, std::size_t bytes,
                                    std::size_t count, const AlgorithmConfig& config);

void allreduce(PeerTransport& transport, Buffer buffer, ReduceOp op, const AlgorithmConfig& config);
void broadcast(PeerTransport& transport, Buffer buffer, int root, const AlgorithmConfig& config);
void allgather(PeerTransport& transport, Buffer input, Buffer output,
               const AlgorithmConfig& config);
void reduce_scatter(PeerTransport& transport, Buffer input, Buffer output, ReduceOp op,
                    const AlgorithmConfig& config);
void barrier(PeerTransport& transport, const AlgorithmConfig& config);

// The algorithms alone, within an op the caller has begun (for compositions, hierarchical.h).
// allreduce_in_op combines with `reduction`, whose complete() finishes each result.
void allreduce_in_op(PeerTransport& transport, Buffer buffer, const Reduction& reduction,
                     const AlgorithmConfig& config);
void broadcast_in_op(PeerTransport& transport, Buffer buffer, int root,
                     const AlgorithmConfig& config);
// The output holds every rank's input in rank order; this rank's own block is copied in first.
void allgather_in_op(PeerTransport& transport, Buffer input, Buffer output,
                     const AlgorithmConfig& config);
// Combines with `reduction` (whose complete() finishes each result); the input is left as it was,
// unless the output lies inside it.
void reduce_scatter_in_op(PeerTransport& transport, Buffer input, Buffer output,
                          const Reduction& reduction, const AlgorithmConfig& config);
// One round where the config takes rounds (direct_bytes > 0), else the dissemination barrier.
void barrier_in_op(PeerTransport& transport, const AlgorithmConfig& config);

}  // namespace ddp::detail::collectives
