#pragma once
// Broadcast: a binomial tree (log2 n hops of the whole message) for small payloads, and for
// large ones a chain from the root around the ring, pipelined in chunks so that every rank
// forwards chunk c while chunk c+1 arrives.
#include "comm/collectives/algorithm_config.h"
#include "comm/collectives/peer_transport.h"
#include "ddp/comm/types.h"

namespace ddp::detail::collectives {

// Stages `buffer` through transport scratch (no registration of caller memory).
void broadcast_binomial_tree(PeerTransport& transport, Buffer buffer, int root);

// `buffer` must be exposed by the caller.
void broadcast_pipelined_chain(PeerTransport& transport, Buffer buffer, int root,
                               const AlgorithmConfig& config);

}  // namespace ddp::detail::collectives
