#pragma once
// Every rank sends one payload to every other rank and receives theirs, on gloo's asynchronous
// mesh: the direct exchange's data path for payloads too large for its blocking writes (see
// GlooDirectExchange::kMaxPayloadBytes) but small enough that one round of messages beats the
// ring. It checks nothing itself: the caller runs the direct exchange's signature check first,
// so the ranks agree on the payloads' sizes before anything here is read.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <vector>

#include "comm/gloo/gloo_exchange_slots.h"
#include "comm/gloo/gloo_fwd.h"

namespace ddp::detail {

class GlooPayloadExchange {
 public:
  using Clock = std::chrono::steady_clock;

  // Where this rank's payload is sent from.
  enum class SendFrom {
    kStagedCopy,    // a copy in the exchange's own memory: the caller may change the payload
    kCallerMemory,  // the payload itself, which must stay unchanged until finish() returns
  };

  GlooPayloadExchange(std::shared_ptr<gloo::Context> mesh, std::size_t max_payload_bytes);
  ~GlooPayloadExchange();

  // The largest payload start() takes.
  std::size_t max_payload_bytes() const { return max_payload_bytes_; }

  // Sends `payload` to every peer.
  void start(const void* payload, std::size_t payload_bytes, SendFrom from);
  // Waits for the peers' payloads and for this rank's sends; gloo's IoException on transport
  // failure or when `deadline` passes.
  void finish(Clock::time_point deadline);

  // Drops the pending receives and lets go of the mesh, so that the caller can close the pairs
  // right after; the storage the receives pointed into stays until destruction (see
  // GlooPeerTransport::fail). Only destruction may follow.
  void abandon();

  // After finish(): the payload rank `peer` sent (this rank's own when peer == rank: the
  // caller's memory itself if sent from there). Valid until the next start().
  const void* payload_of(int peer) const;

 private:
  // The receives of exchange k+1 are posted as soon as exchange k completes, into the other
  // half of the receive storage: gloo holds a send back until the receiver has posted its
  // receive, so posting early saves that notification's round trip.
  void post_receives(int half, std::uint64_t slot);

  std::shared_ptr<gloo::Context> mesh_;
  std::size_t max_payload_bytes_;
  GlooExchangeSlots slots_;
  std::unique_ptr<gloo::transport::UnboundBuffer> send_buffer_;  // over the staging slot
  // Over the caller's payload while an exchange sends from there, else null.
  std::unique_ptr<gloo::transport::UnboundBuffer> caller_buffer_;
  const void* own_payload_ = nullptr;  // what payload_of(rank) returns
  std::unique_ptr<gloo::transport::UnboundBuffer> recv_buffer_;
  int posted_half_ = 0;  // receives for the next exchange are posted here
  std::uint64_t posted_slot_ = 0;
  int last_half_ = 0;  // where the last exchange received
  // gloo slots of the exchanges: a counter of its own (gloo's nextSlot() is an int and would
  // overflow in a long job), from 2^62, clear of gloo's collectives (below 2^60) and of
  // GlooPeerTransport's slots (bit 63 set).
  std::uint64_t next_slot_ = std::uint64_t{1} << 62;
  // Posting early can fail because a peer already left after the last collective: that is
  // only an error if another exchange follows, so it is raised by the next start().
  std::exception_ptr deferred_error_;
};

}  // namespace ddp::detail
