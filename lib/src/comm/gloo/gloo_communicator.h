#pragma once
// The Gloo-over-TCP backend (DDP_BACKEND=gloo): gloo's rendezvous and TCP pairs as a
// PeerTransport (GlooPeerTransport) under the shared collectives. Inside nodes, when the
// collectives are hierarchical, the node's level is libddp_fabric's shared memory where that
// module loads, else gloo's pairs too.
#include <memory>

#include "comm/transport_communicator.h"
#include "ddp/store.h"

namespace ddp::detail {

class GlooCommunicator final : public TransportCommunicator {
 public:
  GlooCommunicator(std::shared_ptr<Store> store, int rank, int size, const CommOptions& options);
  // Stops the op queue while this is still a GlooCommunicator (see Communicator::shutdown).
  ~GlooCommunicator() override { shutdown(); }

  const char* backend_name() const override { return "gloo"; }
};

}  // namespace ddp::detail
