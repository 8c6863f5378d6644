#pragma once
// The collectives' defaults for a libfabric provider (as fi_info names it, e.g. "tcp;ofi_rxm"),
// before the environment's overrides (AlgorithmConfig::from_env).
#include <string>

#include "comm/collectives/algorithm_config.h"

namespace ddp::detail::fabric {

// Where a core copies every byte (shm, tcp) the ring runs in larger chunks, one receive ahead.
// On TCP every message past the eager size costs ofi_rxm a rendezvous, so the ring, which sends
// 2(P-1) messages per rank to recursive doubling's log2(P), starts at larger payloads. No
// provider takes one-round collectives by default: recursive doubling's log2(P) messages cost
// less than a round's P-1 where a message costs no thread wake-up.
collectives::AlgorithmConfig algorithm_defaults(const std::string& provider);

}  // namespace ddp::detail::fabric
