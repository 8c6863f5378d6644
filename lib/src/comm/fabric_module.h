#pragma once
// The fabric backend lives in its own library, libddp_fabric, that libddp loads only when
// DDP_BACKEND=fabric: programs that use gloo never load libfabric and its provider libraries
// (PSM, verbs), nor run their constructors.
#include <memory>

#include "ddp/comm/communicator.h"
#include "ddp/store.h"

// The module's one entry point (extern "C": looked up by name with dlsym).
#define DDP_FABRIC_ENTRY_POINT ddp_fabric_create_communicator
#define DDP_FABRIC_ENTRY_POINT_NAME "ddp_fabric_create_communicator"

extern "C" ddp::Communicator* DDP_FABRIC_ENTRY_POINT(const std::shared_ptr<ddp::Store>& store,
                                                     int rank, int size,
                                                     const ddp::CommOptions& options);

namespace ddp::detail {

// Loads libddp_fabric (once per process; found next to libddp, else on the loader's search
// path) and creates a communicator with it. Throws ConfigError when the module cannot be loaded.
std::unique_ptr<Communicator> create_fabric_communicator(std::shared_ptr<Store> store, int rank,
                                                         int size, const CommOptions& options);

}  // namespace ddp::detail
