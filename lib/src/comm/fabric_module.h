#pragma once
// The fabric backend lives in its own library, libddp_fabric, that libddp loads only when
// DDP_BACKEND=fabric: programs that use gloo never load libfabric and its provider libraries
// (PSM, verbs), nor run their constructors.
#include <chrono>
#include <memory>
#include <string>

#include "comm/collectives/algorithm_config.h"
#include "comm/collectives/peer_transport.h"
#include "ddp/comm/communicator.h"
#include "ddp/store.h"

namespace ddp::detail {

struct FabricModule;

// A transport joining the ranks of one node, for the other backends' hierarchical collectives.
struct NodeTransport {
  std::unique_ptr<collectives::PeerTransport> transport;
  collectives::AlgorithmConfig config;  // its provider's defaults, with the environment's overrides
  std::string provider;                 // "shm", or what connect_fabric chose where shm cannot run
};

// Loads libddp_fabric (once per process; found next to libddp, else on the loader's search
// path) and creates a communicator with it. Throws ConfigError when the module cannot be loaded.
std::unique_ptr<Communicator> create_fabric_communicator(std::shared_ptr<Store> store, int rank,
                                                         int size, const CommOptions& options);

// The same module's transport for the ranks of one node (FabricModule::connect_node), for the
// hierarchical collectives of the gloo backend. Throws ConfigError when the module cannot be
// loaded, and what connect_fabric throws.
NodeTransport connect_fabric_node(Store& store, int rank, int size, const CommOptions& options,
                                  const std::string& group);

// The module's entry point in the library at `path` (dlopen'ed for good: libfabric providers do
// not support being unloaded). Throws ConfigError when it cannot be loaded, or was built from
// other sources than this libddp.
using FabricEntryPoint = const FabricModule* (*)();
FabricEntryPoint load_fabric_entry_point(const std::string& path);

}  // namespace ddp::detail
