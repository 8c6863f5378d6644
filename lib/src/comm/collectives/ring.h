#pragma once
// The bandwidth-optimal ring, pipelined in chunks. The buffer is split into size() blocks.
// Reduce-scatter (size()-1 steps) leaves block r fully reduced on rank r; allgather (size()-1
// steps) then passes every finished block around. Each block is cut into chunks, and a chunk
// moves on to the next step as soon as it has arrived (and been reduced), so transfers of
// later chunks overlap the reduction of earlier ones and every link stays busy.
#include <cstddef>
#include <vector>

#include "comm/collectives/algorithm_config.h"
#include "comm/collectives/peer_transport.h"
#include "comm/reduce_kernels.h"
#include "ddp/comm/types.h"

namespace ddp::detail::collectives {

enum class RingPhases { kReduceScatter, kAllgather, kBoth };

// The plan every rank derives from the element count alone.
struct RingLayout {
  std::size_t chunks_per_block;
  std::size_t max_chunk_bytes;
  // Scratch the reduce-scatter phase needs for its in-flight chunks.
  std::size_t slot_bytes(const AlgorithmConfig& config) const;
};

RingLayout ring_layout(std::size_t count, DataType dtype, int ranks, const AlgorithmConfig& config,
                       std::size_t max_message_bytes);

// Chunk `chunk` of the block a rank receives at `step` (counted from the first step run).
struct Segment {
  int step;
  std::size_t chunk;
};

// The orders in which a rank may take its incoming chunks (every rank the same one). In step
// order a rank reduces its whole block before its peer reads any of it back in the allgather, by
// then (from a few MiB) out of the caches. In a wavefront, chunk c at step s comes right after
// chunk c+1 at step s-1, so a reduced chunk leaves again while it is still in them.
std::vector<Segment> wavefront_order(int steps, std::size_t chunks);
std::vector<Segment> step_order(int steps, std::size_t chunks);

// Runs the phases on `buffer` (exposed by the caller) within the current op. `slots` is at least
// layout.slot_bytes(config) of transport memory when reduce-scatter runs. `reduction` combines
// received chunks in place, its complete() at the step that finishes a block (null for
// allgather).
void run_ring(PeerTransport& transport, Buffer buffer, RingPhases phases,
              const Reduction* reduction, const RingLayout& layout, const AlgorithmConfig& config,
              char* slots);

}  // namespace ddp::detail::collectives
