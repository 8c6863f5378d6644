#pragma once
// Creates a communicator by backend name, so that the backend is a run-time choice
// (DDP_BACKEND=gloo|fabric) and callers never name a backend type.
#include <memory>
#include <string>
#include <vector>

#include "ddp/comm/communicator.h"

namespace ddp {

class Store;

// The backends compiled into this build, e.g. {"gloo", "fabric"}.
std::vector<std::string> available_backends();

// DDP_BACKEND, else "gloo". Throws ConfigError for a name that is not available.
std::string backend_from_env();

// Connects `size` ranks through `store` (a prefix per group is the caller's choice).
// Throws ConfigError for an unknown backend, CommError/StoreError if peers cannot be reached.
std::unique_ptr<Communicator> create_communicator(const std::string& backend,
                                                  std::shared_ptr<Store> store, int rank, int size,
                                                  const CommOptions& options = {});

}  // namespace ddp
