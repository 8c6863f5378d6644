#pragma once
// The ring's bytes over one loopback TCP connection, 2 ranks (see tcp_socket_exchange.cpp).
#include "allreduce_variants.h"

namespace ddp::bench {

VariantFactory tcp_socket_exchange_variant();

}  // namespace ddp::bench
