#pragma once
// Tuning of the shared collectives: which allreduce algorithm, where the switch to the ring
// happens and how finely the ring is pipelined. The fabric backend starts from its provider's
// defaults (for_provider) and lets the environment override every value (from_env).
#include <cstddef>
#include <cstdint>
#include <string>

namespace ddp::detail::collectives {

enum class AllreduceAlgorithm { kAuto, kRing, kRecursiveDoubling };

// The order in which the ring takes its incoming chunks (ring.h, wavefront_order).
enum class RingOrder { kWavefront, kStep };

const char* to_string(AllreduceAlgorithm algorithm);

struct AlgorithmConfig {
  // DDP_FABRIC_ALGORITHM=auto|ring|recursive_doubling
  AllreduceAlgorithm allreduce = AllreduceAlgorithm::kAuto;
  // DDP_FABRIC_RING_THRESHOLD: payloads of at least this many bytes use the bandwidth-optimal
  // ring (allreduce) or pipelined chain (broadcast); smaller ones the latency-optimal schemes.
  std::size_t ring_threshold_bytes = 64 * 1024;
  // DDP_FABRIC_CHUNK_BYTES: the pipeline unit of the ring and the chain.
  std::size_t chunk_bytes = 256 * 1024;
  // When set, a ring block smaller than kMinChunksPerBlock chunks is cut into that many chunks,
  // down to this size, so that mid-sized buffers still pipeline (0: chunks are chunk_bytes).
  std::size_t min_chunk_bytes = 0;
  static constexpr std::size_t kMinChunksPerBlock = 4;
  // DDP_FABRIC_PIPELINE_DEPTH: receives kept posted at once, the one being waited for included.
  int pipeline_depth = 4;
  // DDP_FABRIC_RING_ORDER=wavefront|step. The wavefront sends a reduced chunk on while it is
  // still in the reducing core's caches: faster where the next reader is that core (the kernel's
  // copy over TCP) or shares its caches; on shm it measured slower in most runs of this VM's
  // other core placement (README "Measurements"). Ranks must agree: mixed orders can deadlock.
  RingOrder ring_order = RingOrder::kWavefront;

  // A hash of the settings that shape messages; ranks must agree on it (it travels in the op
  // header).
  std::uint64_t fingerprint() const;

  // The defaults for a libfabric provider (as fi_info names it, e.g. "tcp;ofi_rxm"). Where a
  // core copies every byte (shm, tcp) the ring runs in larger chunks, one receive ahead. On TCP
  // every message past the eager size costs ofi_rxm a rendezvous, so the ring, which sends
  // 2(P-1) messages per rank to recursive doubling's log2(P), starts at larger payloads.
  static AlgorithmConfig for_provider(const std::string& provider);
  // `defaults` (for_provider's), overridden by the variables above (ConfigError on malformed
  // values).
  static AlgorithmConfig from_env(AlgorithmConfig defaults);
};

}  // namespace ddp::detail::collectives
