#include "comm/fabric/fabric_communicator.h"

#include "comm/fabric/fabric_connection.h"
#include "comm/fabric/fabric_transport.h"

namespace ddp::detail {

FabricCommunicator::FabricCommunicator(std::shared_ptr<Store> store, int rank, int size,
                                       const CommOptions& options)
    : TransportCommunicator(rank, size, options) {
  auto connect_level = [&](const std::shared_ptr<Store>& level_store, int level_rank,
                           int level_size, const std::string& group) {
    auto connection = fabric::connect_fabric(*level_store, level_rank, level_size, options, group);
    return Level{std::move(connection.transport), connection.config,
                 std::move(connection.provider)};
  };
  connect(store, connect_level, connect_level);
}

}  // namespace ddp::detail
