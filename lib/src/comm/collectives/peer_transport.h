#pragma once
// The small point-to-point interface the collective algorithms are written against: tagged
// sends and receives to a peer rank, and waits that drive progress. Every backend is one of
// these and the code that connects it: FabricTransport on libfabric, GlooPeerTransport on gloo's
// TCP pairs; the unit tests implement it in memory, so every algorithm can be checked at any
// world size without a network.
//
// A collective is bracketed by begin_op/end_op. Inside it, a message is identified by
// (peer, index): the sender and the receiver must use the same index for the same message.
//
// A transport may also offer a round (exchange): every rank sends one payload to every other
// rank and receives theirs, the whole op in one step. The direct algorithms (direct.h) are built
// on it. The default runs it over send/recv; gloo's transport runs it on blocking writes and
// reads by the calling thread, with the op's signature in the same message, so a small
// collective costs one message per peer and one wake-up.
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "comm/collective_signature.h"
#include "ddp/flight_recorder.h"

namespace ddp::detail::collectives {

class PeerTransport {
 public:
  using Request = std::uint32_t;

  virtual ~PeerTransport() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Starts a collective and its deadline. `signature` says what this rank believes the
  // collective is, its plan the fingerprint of the settings that shape its messages (the
  // sequence number is the transport's to fill in); a peer that believes otherwise fails the op
  // with a clear error before any data moves between the two.
  virtual void begin_op(const CollectiveSignature& signature) = 0;
  // Waits for every request not yet waited for and releases the op's memory registrations.
  virtual void end_op() = 0;

  // Makes caller memory usable in sends and receives until end_op (registers it with the fabric).
  virtual void expose(const void* data, std::size_t bytes) = 0;
  // Transport-owned memory usable in sends and receives, at least `bytes` long. Valid until the
  // next call to scratch(); the contents are not preserved across calls.
  virtual void* scratch(std::size_t bytes) = 0;

  // Posts a message; `data` lies in exposed or scratch memory (or bytes == 0, or bytes is at
  // most eager_message_bytes()). The memory must not change until the request completes, or
  // until the peer's matching receive has completed: a transport never reads a send's memory
  // after that, even where it reports the send's completion later (shm reports them in posting
  // order). The ring relies on this.
  virtual Request send(int peer, std::uint32_t index, const void* data, std::size_t bytes) = 0;
  // Posts a receive of exactly `bytes`: a message of another length fails the op.
  virtual Request recv(int peer, std::uint32_t index, void* data, std::size_t bytes) = 0;
  // Drives progress until the request completes and releases it. Throws CommError (or
  // TimeoutError once the op's deadline passes) naming the op and the peer.
  virtual void wait(Request request) = 0;

  // Fails the transport from outside, when another transport of the same communicator failed:
  // tells the peers where the transport can, so that their waits end now rather than at their
  // timeout, and refuses later ops; no request touches caller memory after it. Nothing once the
  // transport has failed.
  virtual void abort(const std::string& reason) = 0;

  // Where exchange() may send this rank's payload from.
  enum class PayloadSource {
    kStage,    // a copy: the caller may overwrite the payload while the round runs
    kInPlace,  // the payload itself, unchanged until exchange() returns
  };
  static constexpr int kEveryRank = -1;
  // Within an op, as its only traffic: sends `payload` (`bytes` long, at most
  // round_payload_bytes()) to every peer and receives every peer's. With `sender` == kEveryRank
  // every rank sends `bytes`; otherwise only rank `sender` does and the others send empty
  // messages (a broadcast). Every rank passes the same `bytes` and `sender`. Returns when every
  // peer's message has arrived; exchanged() then reads them.
  virtual void exchange(const void* payload, std::size_t bytes, int sender, PayloadSource source);
  // After exchange(): the payload `peer` sent (this rank's own too). Valid until the op ends.
  virtual const void* exchanged(int peer) const;
  // The largest payload exchange() carries. The default round keeps every rank's payload in
  // scratch memory: it stops at 64 MiB of it (and at the largest message).
  virtual std::size_t round_payload_bytes() const;

  // The job's rank of each of this transport's ranks (a node's or the cross-node level's ranks
  // are not the job's); unset, they are the same.
  void set_global_ranks(std::vector<int> ranks) { global_ranks_ = std::move(ranks); }
  // Tells the flight recorder which peer the running op now waits on.
  void note_waiting_on(int peer) const {
    flight::Recorder::note_waiting_on(
        peer < 0 || global_ranks_.empty() ? peer : global_ranks_[static_cast<std::size_t>(peer)]);
  }

  // Largest payload of one message.
  virtual std::size_t max_message_bytes() const = 0;
  // Largest message the provider copies eagerly, with no handshake between the ranks (shm's
  // inject size); 0 where every message costs the same. A payload a few times this size moves
  // faster as several eager messages than as one large one.
  virtual std::size_t eager_message_bytes() const = 0;

 private:
  // The default exchange's received payloads: one slot per rank in scratch memory.
  const char* round_slots_ = nullptr;
  std::size_t round_slot_bytes_ = 0;
  std::vector<int> global_ranks_;
};

}  // namespace ddp::detail::collectives
