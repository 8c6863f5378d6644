#pragma once
// The direct collectives: the whole op in one round (PeerTransport::exchange), every rank sending
// its payload to every other. A rank sends (P-1) times its payload where the ring sends about
// twice it, so they pay only for small payloads on transports whose every message costs a thread
// wake-up; AlgorithmConfig::direct_bytes says up to where. Reductions combine the ranks' payloads
// in rank order on every rank, so every rank computes bit-identical results.
#include "comm/collectives/algorithm_config.h"
#include "comm/collectives/peer_transport.h"
#include "comm/reduce_kernels.h"
#include "ddp/comm/types.h"

namespace ddp::detail::collectives {

// Whether a collective in which each rank sends `payload_bytes` to every peer takes one round.
bool takes_direct(const PeerTransport& transport, std::size_t payload_bytes,
                  const AlgorithmConfig& config);

// Within an op the caller has begun, as its only traffic.
void allreduce_direct(PeerTransport& transport, Buffer buffer, const Reduction& reduction);
void broadcast_direct(PeerTransport& transport, Buffer buffer, int root);
void allgather_direct(PeerTransport& transport, Buffer input, Buffer output);
void reduce_scatter_direct(PeerTransport& transport, Buffer input, Buffer output,
                           const Reduction& reduction);
// No rank leaves the round before it has heard from every other rank.
void barrier_direct(PeerTransport& transport);

}  // namespace ddp::detail::collectives
