#pragma once
// Collectives written against PeerTransport only, for any backend: each call brackets one
// op (begin_op/end_op), picks the algorithm for the payload and runs it. Arguments have been
// validated by Communicator; here every rank still checks the others' through the op header.
#include "comm/collectives/algorithm_config.h"
#include "comm/collectives/peer_transport.h"
#include "ddp/comm/types.h"

namespace ddp::detail::collectives {

// The allreduce algorithm `config` picks for a payload of `bytes` and `count` elements.
AllreduceAlgorithm choose_allreduce(std::size_t bytes, std::size_t count, int ranks,
                                    const AlgorithmConfig& config);

void allreduce(PeerTransport& transport, Buffer buffer, ReduceOp op, const AlgorithmConfig& config);
void broadcast(PeerTransport& transport, Buffer buffer, int root, const AlgorithmConfig& config);
void allgather(PeerTransport& transport, Buffer input, Buffer output,
               const AlgorithmConfig& config);
void reduce_scatter(PeerTransport& transport, Buffer input, Buffer output, ReduceOp op,
                    const AlgorithmConfig& config);
void barrier(PeerTransport& transport);

}  // namespace ddp::detail::collectives
