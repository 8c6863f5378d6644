#pragma once
// Allreduce variants specific to the libfabric backend, kept apart from the shared benchmark:
// the bare two-rank ring written directly on libfabric shm that the backend's goals are set
// against, and (with DDP_BENCH_FABRIC_TUNING=1) the backend under other chunk sizes, pipeline
// depths and algorithm choices, for tuning its defaults. (shm's copy mode, FI_SHM_DISABLE_CMA,
// is read once per process: compare it by running the whole benchmark with and without it.)
#include <vector>

#include "allreduce_variants.h"

namespace ddp::bench {

// Empty unless the library was built with the fabric backend. Variants that only make sense
// for two ranks (the bare ring) leave themselves out of other world sizes.
std::vector<VariantFactory> fabric_variants(int world_size);

}  // namespace ddp::bench
