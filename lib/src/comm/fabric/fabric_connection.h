#pragma once
// Brings up the fabric for one group of ranks: host discovery through the store, provider
// choice, endpoint, address exchange, and a transport over it. FabricCommunicator is built on
// this; tests use it to drive the transport directly.
#include <chrono>
#include <memory>
#include <string>

#include "comm/collectives/algorithm_config.h"

namespace ddp {
class Store;
}

namespace ddp::detail::fabric {

class FabricTransport;

struct FabricConnection {
  std::unique_ptr<FabricTransport> transport;
  std::string provider;  // as libfabric names it, e.g. "shm" or "tcp;ofi_rxm"
  // The provider's defaults (algorithm_defaults, provider_tuning.h) with the environment's
  // overrides.
  collectives::AlgorithmConfig config;
};

// Every rank of the group calls this with the same store. Throws ConfigError (no usable
// provider, a malformed DDP_FABRIC_* setting), CommError("connect", ...) naming a peer that
// failed, StoreError if the store does not answer.
// `group` names a part of the job in the log ("inside node 2"; empty for the whole job, whose
// rank 0 logs the choice at info level, every other group at debug level).
FabricConnection connect_fabric(Store& store, int rank, int size, const CommOptions& options,
                                const std::string& group = "");

}  // namespace ddp::detail::fabric
