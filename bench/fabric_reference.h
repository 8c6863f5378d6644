#pragma once
// The bare two-rank libfabric ring on one provider (see fabric_reference.cpp).
#include <string>

#include "allreduce_variants.h"

namespace ddp::bench {

VariantFactory bare_ring_variant(const std::string& name, const char* provider);

}  // namespace ddp::bench
