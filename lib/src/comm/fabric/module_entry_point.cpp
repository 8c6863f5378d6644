// libddp_fabric's entry point, called by libddp after it loads this module (fabric_module.h).
#include "comm/fabric/fabric_communicator.h"
#include "comm/fabric/fabric_connection.h"
#include "comm/fabric/fabric_transport.h"
#include "comm/fabric_entry_point.h"

namespace {

ddp::Communicator* create_communicator(const std::shared_ptr<ddp::Store>& store, int rank, int size,
                                       const ddp::CommOptions& options) {
  return new ddp::detail::FabricCommunicator(store, rank, size, options);
}

ddp::detail::NodeTransport connect_node(ddp::Store& store, int rank, int size,
                                        const ddp::CommOptions& options, const std::string& group) {
  auto connection = ddp::detail::fabric::connect_fabric(store, rank, size, options, group);
  return {std::move(connection.transport), connection.config, connection.provider};
}

constexpr ddp::detail::FabricModule kModule{&create_communicator, &connect_node};

}  // namespace

extern "C" const ddp::detail::FabricModule* DDP_FABRIC_ENTRY_POINT() { return &kModule; }
