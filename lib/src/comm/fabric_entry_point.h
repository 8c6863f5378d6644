#pragma once
// The one function libddp_fabric exports, which libddp looks up with dlsym after loading it.
// Its name carries DDP_FABRIC_BUILD_ID, a hash of the headers both libraries are compiled
// against (cmake/DdpBuildId.cmake): a module left from other sources lacks the symbol, and
// loading it fails with a clear error instead of calling into a different ABI.
#include <chrono>
#include <memory>
#include <string>

#include "comm/fabric_module.h"
#include "ddp/comm/communicator.h"
#include "ddp/store.h"
#include "fabric_build_id.h"

#define DDP_FABRIC_CONCAT_(a, b) a##b
#define DDP_FABRIC_CONCAT(a, b) DDP_FABRIC_CONCAT_(a, b)
#define DDP_FABRIC_STRING_(a) #a
#define DDP_FABRIC_STRING(a) DDP_FABRIC_STRING_(a)

#define DDP_FABRIC_ENTRY_POINT \
  DDP_FABRIC_CONCAT(ddp_fabric_create_communicator_, DDP_FABRIC_BUILD_ID)
#define DDP_FABRIC_ENTRY_POINT_NAME DDP_FABRIC_STRING(DDP_FABRIC_ENTRY_POINT)

namespace ddp::detail {

// What the module offers.
struct FabricModule {
  Communicator* (*create_communicator)(const std::shared_ptr<Store>& store, int rank, int size,
                                       const CommOptions& options);
  // Every rank of the node calls this with the same store; all of them must be on this host.
  // Throws as connect_fabric does.
  NodeTransport (*connect_node)(Store& store, int rank, int size, const CommOptions& options,
                                const std::string& group);
};

}  // namespace ddp::detail

extern "C" const ddp::detail::FabricModule* DDP_FABRIC_ENTRY_POINT();
