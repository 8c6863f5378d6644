#pragma once
// One step in which every rank sends the same message (a collective signature, optionally
// followed by a small payload) to every other rank and receives theirs. It checks that all
// ranks agree on the collective and, for small payloads, carries the data itself, so a small
// allreduce, broadcast, allgather or barrier costs a single round of messages.
//
// The exchange runs on a gloo mesh of its own whose pairs are in gloo's synchronous mode: the
// calling thread writes and reads the sockets itself. On the asynchronous mesh every message is
// read by gloo's device thread, which then wakes the waiting thread, and every send waits for
// the receiver's "ready" notification: two or three thread wake-ups per small collective where
// this needs one.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "comm/collective_signature.h"
#include "comm/gloo/gloo_exchange_slots.h"
#include "comm/gloo/gloo_fwd.h"

namespace ddp::detail {

class GlooDirectExchange {
 public:
  // The largest payload a message carries. The calling thread writes with blocking writes, one
  // message per peer, before it reads theirs. That cannot deadlock: a peer never has more than
  // two of this rank's messages unread (the last exchange's and this one), and they fit the
  // socket's buffers (gloo sizes a socket's send buffer to the message, the kernel doubles that,
  // and the receiving side starts at 64 KiB or more), so no write waits for a reader that is
  // itself stuck writing.
  static constexpr std::size_t kMaxPayloadBytes = 64 * 1024;

  // `mesh` must be used by nothing else: its pairs switch to synchronous mode. Every signature
  // sent carries `plan` (see CollectiveSignature::plan). A read or write that makes no progress
  // for the mesh's timeout fails with gloo's IoException.
  GlooDirectExchange(std::shared_ptr<gloo::Context> mesh, std::uint64_t plan);
  ~GlooDirectExchange();

  // Sends `mine` (+ a payload of up to kMaxPayloadBytes) to all peers and receives theirs.
  // Throws CommError naming the first peer that disagrees, gloo's IoException on transport
  // failure or timeout. After any exception the mesh's streams may be out of step: the
  // exchange must not be used again.
  void run(const CollectiveSignature& mine, const void* payload, std::size_t payload_bytes);

  // run() in two halves, so that a collective can start moving its data while the signatures
  // are on their way. start() stamps the signature with the next sequence number, sends it and
  // returns it as sent; finish() receives the peers' messages and checks them as run() does.
  CollectiveSignature start(const CollectiveSignature& mine, const void* payload,
                            std::size_t payload_bytes);
  void finish();

  // After run(): the payload rank `peer` sent (this rank's own when peer == rank). Valid
  // until the next run() starts.
  const void* payload_of(int peer) const;

 private:
  // Per peer: gloo buffers bound to its two receive slots and the matching send buffers over
  // the staged message.
  struct PeerBuffers {
    std::unique_ptr<gloo::transport::Buffer> send[2];
    std::unique_ptr<gloo::transport::Buffer> recv[2];
  };

  std::shared_ptr<gloo::Context> mesh_;
  std::uint64_t plan_;
  GlooExchangeSlots slots_;
  std::vector<PeerBuffers> peers_;
  int half_ = 1;  // where the current exchange receives; the first start() flips it to 0
  std::uint64_t next_sequence_ = 0;
  CollectiveSignature sent_;  // what the current start() sent
};

}  // namespace ddp::detail
