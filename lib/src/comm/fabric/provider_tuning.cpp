#include "comm/fabric/provider_tuning.h"

namespace ddp::detail::fabric {

collectives::AlgorithmConfig algorithm_defaults(const std::string& provider) {
  collectives::AlgorithmConfig config;
  const bool tcp = provider.find("tcp") != std::string::npos;
  const bool shm = provider == "shm";
  if (tcp || shm) {
    // On shm (the receiver's CMA copy) and over TCP (the kernel's copies) a CPU core moves every
    // byte: a deeper pipeline overlaps nothing with the reduction on these cores, it only adds
    // messages and evicts what the reduction is about to read. Larger chunks with one receive
    // posted ahead, against 256 KiB chunks with three ahead, 2 ranks interleaved: 1.1-1.2x at
    // 1-64 MiB on shm and tcp (bench/allreduce_bench with DDP_BENCH_FABRIC_TUNING=1,
    // bench/results/2026-11-23-fabric-pipeline.txt). EFA keeps the deeper pipeline: its NIC
    // moves the data while the core reduces.
    config.chunk_bytes = std::size_t{512} << 10;
    config.pipeline_depth = 2;
  }
  if (shm) {
    // Below this, recursive doubling in 4 KiB injects (up to 32 of them, recursive_doubling.cpp)
    // beats the ring's CMA messages. 2 ranks interleaved with the bare ring and c10d, speed
    // relative to the bare ring, doubling against the ring: 64 KiB 1.54 against 1.23, 128 KiB
    // 1.24 against 1.18; at 256 KiB the ring stays ahead, 1.14 against 1.00
    // (bench/results/2026-11-25-shm-eager-doubling.txt).
    config.ring_threshold_bytes = std::size_t{128} << 10;
  }
  if (tcp) {
    // bench/allreduce_bench with DDP_BENCH_FABRIC_TUNING=1, 2 ranks on tcp;ofi_rxm, recursive
    // doubling against the ring in the same runs: at 16-256 KiB doubling took 0.70-0.98 of the
    // ring's time in both placements of this VM's cores (64 KiB: 135 vs 181 us, 117 vs 152 us);
    // from 1 MiB up which is faster depends on the placement (1 MiB: 888 vs 1213 us in one set,
    // 728 vs 508 in another), and the ring moves fewer bytes on more than 2 ranks.
    config.ring_threshold_bytes = std::size_t{512} << 10;
  }
  return config;
}

}  // namespace ddp::detail::fabric
