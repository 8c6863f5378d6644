// libddp_fabric's entry point, called by libddp after it loads this module (fabric_module.h).
#include "comm/fabric/fabric_communicator.h"
#include "comm/fabric_entry_point.h"

extern "C" ddp::Communicator* DDP_FABRIC_ENTRY_POINT(const std::shared_ptr<ddp::Store>& store,
                                                     int rank, int size,
                                                     const ddp::CommOptions& options) {
  return new ddp::detail::FabricCommunicator(store, rank, size, options);
}
