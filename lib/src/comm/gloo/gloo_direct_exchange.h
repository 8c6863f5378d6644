#pragma once
// One step in which every rank sends the same message (a collective signature, optionally
// followed by a small payload) to every other rank and receives theirs. It checks that all
// ranks agree on the collective and, for small messages, carries the data itself, so a small
// allreduce, broadcast, allgather or barrier costs a single round of messages.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <vector>

#include "comm/collective_signature.h"

namespace gloo {
class Context;
namespace transport {
class UnboundBuffer;
}
}  // namespace gloo

namespace ddp::detail {

class GlooDirectExchange {
 public:
  // Payloads up to `max_payload_bytes` travel in the exchange itself.
  GlooDirectExchange(std::shared_ptr<gloo::Context> context, std::size_t max_payload_bytes);
  ~GlooDirectExchange();

  std::size_t max_payload_bytes() const { return max_payload_; }

  // Sends `mine` (+ payload) to all peers and receives theirs. Throws CommError naming the
  // first peer that disagrees; gloo's IoException on transport failure or timeout.
  void run(const CollectiveSignature& mine, const void* payload, std::size_t payload_bytes,
           std::chrono::milliseconds timeout);

  // After run(): the payload rank `peer` sent (this rank's own when peer == rank). Valid
  // until the next run() starts.
  const void* payload_of(int peer) const;

 private:
  // The receives of exchange k+1 are posted as soon as exchange k completes, into the other
  // half of the receive storage: gloo holds a send back until the receiver has posted its
  // receive, so posting early saves that notification on every small collective.
  void post_receives(int half, std::uint64_t slot);
  char* slot_of(int half, int peer) const;

  std::shared_ptr<gloo::Context> context_;
  std::size_t max_payload_;
  std::size_t slot_bytes_;
  std::vector<char> send_storage_;
  std::vector<char> recv_storage_;
  std::unique_ptr<gloo::transport::UnboundBuffer> send_buffer_;
  std::unique_ptr<gloo::transport::UnboundBuffer> recv_buffer_;
  int current_half_ = 0;  // receives for the next run() are posted here
  std::uint64_t posted_slot_ = 0;
  int last_half_ = 0;  // where the last run() received
  // Posting early can fail because a peer already left after the last collective: that is
  // only an error if another collective follows, so it is raised by the next run().
  std::exception_ptr deferred_error_;
};

}  // namespace ddp::detail
