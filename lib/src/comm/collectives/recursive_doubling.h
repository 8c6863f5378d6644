#pragma once
// Latency-optimal allreduce for small payloads: ceil(log2 n) exchanges of the whole buffer.
// A non-power-of-two world first folds its extra ranks into partners and hands them the result
// at the end. Partners reduce the same two operands (in swapped order, which commutative
// reductions do not notice), so every rank ends with bitwise identical values.
#include "comm/collectives/peer_transport.h"
#include "comm/reduce_kernels.h"
#include "ddp/comm/types.h"

namespace ddp::detail::collectives {

// Reduces `buffer` in place within the current op; receives land in transport scratch.
void allreduce_recursive_doubling(PeerTransport& transport, Buffer buffer,
                                  const Reduction& reduction);

}  // namespace ddp::detail::collectives
