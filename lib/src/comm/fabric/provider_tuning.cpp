#include "comm/fabric/provider_tuning.h"

namespace ddp::detail::fabric {

collectives::AlgorithmConfig algorithm_defaults(const std::string& provider) {
  collectives::AlgorithmConfig config;
  // A hierarchical allreduce in one piece: the pipeline's second thread polls the completion
  // queue as this one does, and two polling threads per rank cost more than the overlap gains
  // (2 pods x 2 ranks on 2 vCPUs: 69-71 % of the link against 77-89 % in one piece at 16-64 MiB,
  // bench/results/2026-11-29-hierarchy-pipeline.txt). gloo's second thread sleeps in read().
  config.piece_bytes = 0;
  const bool tcp = provider.find("tcp") != std::string::npos;
  const bool shm = provider == "shm";
  if (tcp || shm) {
    // On shm (the receiver's CMA copy) and over TCP (the kernel's copies) a CPU core moves every
    // byte: a deeper pipeline overlaps nothing with the reduction on these cores, it only adds
    // messages and evicts what the reduction is about to read, so larger chunks with one receive
    // posted ahead (bench/results/2026-11-23-fabric-pipeline.txt). EFA keeps the deeper
    // pipeline: its NIC moves the data while the core reduces.
    config.chunk_bytes = std::size_t{512} << 10;
    config.pipeline_depth = 2;
  }
  if (shm) {
    // Below this, recursive doubling in 4 KiB injects (up to 32 of them, recursive_doubling.cpp)
    // beats the ring's CMA messages; from 256 KiB the ring is ahead
    // (bench/results/2026-11-25-shm-eager-doubling.txt).
    config.ring_threshold_bytes = std::size_t{128} << 10;
  }
  if (tcp) {
    // Over TCP recursive doubling beats the ring up to a few hundred KiB in every placement of
    // the ranks' cores measured; from 1 MiB up it depends on the placement, and the ring moves
    // fewer bytes on more than 2 ranks (bench/README.md, "The libfabric backend").
    config.ring_threshold_bytes = std::size_t{512} << 10;
    // Two ranks keep the ring. Exchanging the whole buffer (algorithm_config.h) took a job of
    // 2 pods x 1 rank from 65-90 % of a shaped 1 Gbit/s link to 93-98 %, but on the hierarchical
    // level between 2 pods x 2 ranks (two such exchanges at once beside the node's polling
    // ranks) it lost at 16-64 MiB: 49-67 % against the ring's 75-90 %
    // (bench/results/2026-11-29-two-rank-doubling.txt).
  }
  return config;
}

}  // namespace ddp::detail::fabric
