#pragma once
// The bare two-rank libfabric references on one provider (see fabric_reference.cpp).
#include <string>

#include "allreduce_variants.h"

namespace ddp::bench {

VariantFactory bare_ring_variant(const std::string& name, const char* provider);
// Bare recursive doubling in inject-sized pieces, for small payloads (see fabric_reference.cpp).
VariantFactory bare_doubling_variant(const std::string& name, const char* provider);

}  // namespace ddp::bench
