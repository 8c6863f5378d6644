#pragma once
// Tuning of the shared collectives: which allreduce algorithm, up to which size one round of
// messages carries the whole op, where the switch to the ring happens and how finely the ring is
// pipelined. One configuration for every transport: each backend starts from its transport's
// defaults (fabric/provider_tuning.h, gloo/gloo_peer_transport.h) and from_env lets the
// environment override every value.
#include <cstddef>
#include <cstdint>

#include "ddp/comm/communicator.h"

namespace ddp::detail::collectives {

// Public in ddp/comm/communicator.h, as CommOptions' fields.
using ddp::AllreduceAlgorithm;
using ddp::RingOrder;  // the order in which the ring takes its chunks (ring.h, wavefront_order)

const char* to_string(AllreduceAlgorithm algorithm);

struct AlgorithmConfig {
  // DDP_ALGORITHM=auto|direct|ring|recursive_doubling: the allreduce algorithm. `direct` takes
  // one round wherever the transport's round carries the payload, auto's choice elsewhere.
  AllreduceAlgorithm allreduce = AllreduceAlgorithm::kAuto;
  // DDP_DIRECT_BYTES: a collective whose payload times the peer count (the bytes each rank
  // sends) is below this takes one round (direct.h), where every rank sends its payload to every
  // other; 0: never. Pays where each message costs a wake-up (gloo's pairs).
  std::size_t direct_bytes = 0;
  // DDP_RING_THRESHOLD: payloads of at least this many bytes use the bandwidth-optimal ring
  // (allreduce) or pipelined chain (broadcast); smaller ones the latency-optimal schemes.
  std::size_t ring_threshold_bytes = 64 * 1024;
  // DDP_CHUNK_BYTES: the pipeline unit of the ring and the chain.
  std::size_t chunk_bytes = 256 * 1024;
  // When set, a ring block smaller than kMinChunksPerBlock chunks is cut into that many chunks,
  // down to this size, so that mid-sized buffers still pipeline (0: chunks are chunk_bytes).
  std::size_t min_chunk_bytes = 0;
  static constexpr std::size_t kMinChunksPerBlock = 4;
  // DDP_PIPELINE_DEPTH: receives kept posted at once, the one being waited for included.
  int pipeline_depth = 4;
  // DDP_RING_ORDER=wavefront|step. The wavefront sends a reduced chunk on while it is still in
  // the reducing core's caches: faster where the next reader is that core (the kernel's copy over
  // TCP) or shares its caches; on shm it can be slower when the next reader is another core
  // (bench/README.md, "The libfabric backend"). Ranks must agree: mixed orders can deadlock.
  RingOrder ring_order = RingOrder::kWavefront;
  // DDP_HIERARCHY_SLICE_BYTES: from this payload up a hierarchical allreduce reduce-scatters
  // inside the node and sends each rank's 1/L slice across nodes (hierarchical.h); below it the
  // node reduces the whole buffer and every local rank sends all of it.
  std::size_t slice_from_bytes = 8 * 1024;
  // Whether two ranks use the ring from ring_threshold_bytes (else recursive doubling at every
  // size, one exchange of the whole buffer). Between two ranks the two move the same bytes, the
  // ring in two dependent steps with a few chunks in flight, doubling in one with all of it in
  // flight: over gloo's TCP pairs that kept a shaped link 97-98 % busy against the ring's
  // 67-86 % (bench/results/2026-11-29-two-rank-doubling.txt). On shared memory the ring's overlap
  // of the copy with the reduction wins, and libfabric's TCP keeps the ring (provider_tuning.cpp).
  // A transport's default, not a setting; a job on one node keeps the ring
  // (TransportCommunicator::connect).
  bool ring_for_two_ranks = true;
  // DDP_HIERARCHY_PIECE_BYTES: a sliced hierarchical allreduce across N nodes runs pipelined in
  // pieces of (N-1) times this, at most kMaxPieces (hierarchical.h, pipeline_pieces); 0: one
  // piece.
  std::size_t piece_bytes = std::size_t{1} << 20;
  static constexpr std::size_t kMaxPieces = 64;

  // A hash of the settings that shape messages; ranks must agree on it (it travels in the op
  // header).
  std::uint64_t fingerprint() const;

  // `defaults` (the transport's), overridden by the variables above, and those by the fields
  // `options` sets. ConfigError on malformed or out-of-range values, and on the names the
  // variables replaced (DDP_GLOO_ALGORITHM, DDP_FABRIC_*), naming the new one.
  static AlgorithmConfig resolve(AlgorithmConfig defaults, const CommOptions& options);
};

}  // namespace ddp::detail::collectives
