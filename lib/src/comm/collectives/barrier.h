#pragma once
// Dissemination barrier: in round k every rank signals rank + 2^k and waits for rank - 2^k, so
// after ceil(log2 n) rounds of empty messages each rank has heard, transitively, from all.
#include "comm/collectives/peer_transport.h"

namespace ddp::detail::collectives {

void barrier_dissemination(PeerTransport& transport);

}  // namespace ddp::detail::collectives
