#pragma once
// The fabric backend lives in its own library, libddp_fabric, that libddp loads only when
// DDP_BACKEND=fabric: programs that use gloo never load libfabric and its provider libraries
// (PSM, verbs), nor run their constructors.
#include <memory>
#include <string>

#include "ddp/comm/communicator.h"
#include "ddp/store.h"

namespace ddp::detail {

// Loads libddp_fabric (once per process; found next to libddp, else on the loader's search
// path) and creates a communicator with it. Throws ConfigError when the module cannot be loaded.
std::unique_ptr<Communicator> create_fabric_communicator(std::shared_ptr<Store> store, int rank,
                                                         int size, const CommOptions& options);

// The module's entry point in the library at `path` (dlopen'ed for good: libfabric providers do
// not support being unloaded). Throws ConfigError when it cannot be loaded, or was built from
// other sources than this libddp.
using FabricEntryPoint = Communicator* (*)(const std::shared_ptr<Store>&, int, int,
                                           const CommOptions&);
FabricEntryPoint load_fabric_entry_point(const std::string& path);

}  // namespace ddp::detail
