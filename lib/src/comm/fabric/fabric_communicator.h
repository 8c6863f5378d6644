#pragma once
// The libfabric backend (DDP_BACKEND=fabric): the shared collectives over RDM endpoints of the
// provider chosen for the job (efa on AWS, shm within one host, tcp;ofi_rxm otherwise).
// Addresses are exchanged through the rendezvous store. When the collectives are hierarchical
// (TransportCommunicator), the node's level is shm and the cross-node level efa or tcp. This
// header stays free of libfabric's own headers.
#include <memory>

#include "comm/transport_communicator.h"
#include "ddp/store.h"

namespace ddp::detail {

class FabricCommunicator final : public TransportCommunicator {
 public:
  // Opens the endpoints and exchanges addresses through `store`. It does not wait for a first
  // exchange over the fabric: a rank that is slow to start must not see its construction fail
  // because faster ranks already failed a collective; that collective's error reaches it instead.
  FabricCommunicator(std::shared_ptr<Store> store, int rank, int size, const CommOptions& options);
  // Stops the op queue while this is still a FabricCommunicator (see Communicator::shutdown).
  ~FabricCommunicator() override { shutdown(); }

  const char* backend_name() const override { return "fabric"; }
};

}  // namespace ddp::detail
