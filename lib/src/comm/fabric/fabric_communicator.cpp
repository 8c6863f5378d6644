#include "comm/fabric/fabric_communicator.h"

#include "comm/collectives/collectives.h"
#include "comm/fabric/fabric_connection.h"
#include "comm/fabric/fabric_transport.h"
#include "ddp/error.h"

namespace ddp::detail {

FabricCommunicator::FabricCommunicator(std::shared_ptr<Store> store, int rank, int size,
                                       const CommOptions& options)
    : Communicator(rank, size, options) {
  auto connection = fabric::connect_fabric(*store, rank, size, options.timeout);
  provider_ = std::move(connection.provider);
  config_ = connection.config;
  transport_ = std::move(connection.transport);
}

FabricCommunicator::~FabricCommunicator() {
  shutdown();
  transport_.reset();
}

void FabricCommunicator::do_allreduce(Buffer buffer, ReduceOp op) {
  collectives::allreduce(*transport_, buffer, op, config_);
}

void FabricCommunicator::do_broadcast(Buffer buffer, int root) {
  collectives::broadcast(*transport_, buffer, root, config_);
}

void FabricCommunicator::do_allgather(Buffer input, Buffer output) {
  collectives::allgather(*transport_, input, output, config_);
}

void FabricCommunicator::do_reduce_scatter(Buffer input, Buffer output, ReduceOp op) {
  collectives::reduce_scatter(*transport_, input, output, op, config_);
}

void FabricCommunicator::do_barrier() { collectives::barrier(*transport_); }

}  // namespace ddp::detail
