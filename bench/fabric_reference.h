#pragma once
// The bare two-rank libfabric shm ring (see fabric_reference.cpp).
#include "allreduce_variants.h"

namespace ddp::bench {

VariantFactory bare_shm_ring_variant();

}  // namespace ddp::bench
