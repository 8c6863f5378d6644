#pragma once
// The Gloo-over-TCP backend (DDP_BACKEND=gloo): gloo's rendezvous and TCP pairs as a
// PeerTransport (GlooPeerTransport) under the shared collectives. Inside nodes, when the
// collectives are hierarchical, the node's level is libddp_fabric's shared memory where that
// module loads, else gloo's pairs too.
#include <sys/types.h>

#include <memory>
#include <utility>
#include <vector>

#include "comm/transport_communicator.h"
#include "ddp/store.h"

namespace ddp::detail {

class GlooCommunicator final : public TransportCommunicator {
 public:
  GlooCommunicator(std::shared_ptr<Store> store, int rank, int size, const CommOptions& options);
  // Stops the op queue while this is still a GlooCommunicator (see Communicator::shutdown).
  ~GlooCommunicator() override;

  const char* backend_name() const override { return "gloo"; }

 private:
  // The abort notice's waker for a regroup (comm/abort_notice.h): shuts down the sockets of
  // gloo's pairs, from any thread. A wait blocked in gloo (a synchronous pair's read, under the
  // pair's lock, which neither close() nor closeConnections() can take) then fails at once, as
  // if the peers had closed. gloo's TCP pair keeps its socket to itself, so they are the sockets
  // this process opened while the pairs connected, each checked by its inode before the
  // shutdown (a descriptor closed since may have been reused).
  void wake_blocked_waits() const;

  std::vector<std::pair<int, ino_t>> sockets_;  // descriptor, inode
};

}  // namespace ddp::detail
