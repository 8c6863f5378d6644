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

// What is left of `deadline`, as the timeout of a gloo wait (at least 1 ms). Shared by the
// exchange and GlooPeerTransport.
std::chrono::milliseconds gloo_wait_budget(std::chrono::steady_clock::time_point deadline);

class GlooDirectExchange {
 public:
  // Payloads up to `max_payload_bytes` travel in the exchange itself. Every signature sent
  // carries `plan` (see CollectiveSignature::plan).
  GlooDirectExchange(std::shared_ptr<gloo::Context> context, std::size_t max_payload_bytes,
                     std::uint64_t plan);
  ~GlooDirectExchange();

  using Clock = std::chrono::steady_clock;

  // Sends `mine` (+ payload) to all peers and receives theirs. Throws CommError naming the
  // first peer that disagrees; gloo's IoException on transport failure or timeout.
  void run(const CollectiveSignature& mine, const void* payload, std::size_t payload_bytes,
           std::chrono::milliseconds timeout);

  // run() in two halves, so that a collective can start moving its data while the signatures
  // are on their way. start() stamps the signature with the next sequence number, sends it and
  // returns it as sent; finish() waits for the peers' messages and checks them as run() does.
  CollectiveSignature start(const CollectiveSignature& mine, const void* payload,
                            std::size_t payload_bytes);
  void finish(Clock::time_point deadline);

  // After run(): the payload rank `peer` sent (this rank's own when peer == rank). Valid
  // until the next run() starts.
  const void* payload_of(int peer) const;

 private:
  // The receives of exchange k+1 are posted as soon as exchange k completes, into the other
  // half of the receive storage: gloo holds a send back until the receiver has posted its
  // receive, so posting early saves that notification on every small collective.
  void post_receives(int half, std::uint64_t slot);
  std::size_t slot_offset(int half, int peer) const;
  char* slot_of(int half, int peer) const;

  std::shared_ptr<gloo::Context> context_;
  std::uint64_t plan_;
  std::size_t slot_bytes_;
  std::vector<char> send_storage_;
  std::vector<char> recv_storage_;
  std::unique_ptr<gloo::transport::UnboundBuffer> send_buffer_;
  std::unique_ptr<gloo::transport::UnboundBuffer> recv_buffer_;
  int current_half_ = 0;  // receives for the next run() are posted here
  std::uint64_t posted_slot_ = 0;
  int last_half_ = 0;  // where the last run() received
  std::uint64_t next_sequence_ = 0;
  // gloo slots of the exchanges: a counter of its own (gloo's nextSlot() is an int and would
  // overflow in a long job), from 2^62, clear of gloo's collectives (below 2^60) and of
  // GlooPeerTransport's slots (bit 63 set).
  std::uint64_t next_slot_ = std::uint64_t{1} << 62;
  CollectiveSignature sent_;  // what the current start() sent
  // Posting early can fail because a peer already left after the last collective: that is
  // only an error if another collective follows, so it is raised by the next run().
  std::exception_ptr deferred_error_;
};

}  // namespace ddp::detail
