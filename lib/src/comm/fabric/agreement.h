#pragma once
// The agreement protocol's decisions, apart from the libfabric calls that carry them out: ranks
// must check that they run the same collective before data lands where the other side did not
// mean it to. FabricTransport owns one Agreement and asks it, for each message, how to tag it,
// whether it carries the op's digest, whether a header must go first, and whether a receive may be
// posted yet; and, for each header that arrives, what it means. The transport makes every call
// into the provider; the Agreement makes none, so every rule below is tested without a second
// process (tests/lib/comm/fabric/agreement_test.cpp).
//
// Two means, chosen per message:
//  - A small message (up to the inject size) carries a 64-bit digest of this rank's
//    CollectiveSignature as its remote CQ data; the receiver checks it on completion. Its receive
//    is posted at once.
//  - A large message is preceded by an op header (the whole signature) on the peer's header
//    channel, and its receive is posted only once that header has agreed: a large message must
//    never land in a receive of another size (see message_tag.h for why on shm). A rank also
//    sends its header before a small message to a peer it is not receiving from in this op (a
//    broadcast's root, say): that peer may expect a large message and would otherwise wait for a
//    header that never comes, not learning of the disagreement until its timeout.
// The header channel is one receive per peer, posted for the communicator's life and reposted
// once a header is used, so a header is seen even by a rank that expected none: a header for a
// later op waits until this rank gets there, one for an op already completed (its messages all
// checked) is dropped. An all-small op, such as every allreduce up to 8 eager messages, thus
// costs no message beyond its data: a header in every op added a fifth to a small allreduce on
// shm (bench/results/2026-11-23-shm-small-digests.txt).
//
// Over ofi_rxm every data message carries the digest, large ones too, and headers are sent only
// after a slow wait (kHeaderAfterIdle): rxm reports a message longer than its receive as a
// truncation, so the shm hazard above does not exist there, and a header message of its own would
// cost each op a send and a receive system call per peer. A provider without 8 bytes of CQ data
// sends the header before every first message and defers every receive until it agreed.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "comm/collective_signature.h"

namespace ddp::detail::fabric {

// How a provider carries digests (chosen once, from its attributes).
struct DigestPolicy {
  std::size_t inject_bytes = 0;     // a larger message is "large"
  bool digests_in_cq_data = false;  // ofi_rxm: every data message carries the digest
  bool small_digests = false;       // elsewhere, with 8 bytes of CQ data: small messages do
};

class Agreement {
 public:
  using Request = std::uint32_t;

  // What a header from a peer means for this rank.
  enum class Verdict : std::uint8_t {
    kAgrees,     // for this op, and it agrees: its deferred receives are ready; repost the channel
    kDisagrees,  // for this op, and it does not: the op fails
    kLater,      // for an op this rank has not reached: keep it; the channel stays unposted
    kEarlier,    // for an op this rank completed: dropped; repost the channel
  };

  Agreement(int size, DigestPolicy policy);

  // The op. begin_op numbers it (the sequence every tag and header carries) and returns the peers
  // whose channels hold a header kept for a later op: the transport hands each to take_header
  // again, which keeps those still ahead.
  std::vector<int> begin_op(const CollectiveSignature& signature);
  void end_op();
  bool in_op() const { return in_op_; }
  std::uint32_t sequence() const { return sequence_; }
  const CollectiveSignature& header() const { return header_; }
  std::uint64_t digest() const { return digest_; }

  // Messages. Sender and receiver must decide alike, from the size alone.
  // Whether a data message of `bytes` carries the tag's large bit.
  bool large_message(std::size_t bytes) const;
  // Whether a data message of `bytes` carries the op's digest as its CQ data.
  bool carries_digest(std::size_t bytes) const;
  // The tag of a data message of this op sent by `source`.
  std::uint64_t data_tag(int source, std::uint32_t index, std::size_t bytes) const;
  // The tag of `source`'s header channel: sequence 0 and the header index, never a data tag.
  static std::uint64_t header_tag(int source);
  // Whether a received data message, `bytes` long, with `data` as its CQ data (if `has_data`)
  // passes the digest check; messages without a digest always do (their header was checked).
  bool digest_matches(std::size_t bytes, bool has_data, std::uint64_t data) const;

  // Sends: whether this op's header must go to `peer` before a data message of `bytes`; true
  // once per peer and op (the caller then sends it).
  bool header_due_before_send(int peer, std::size_t bytes);
  // Slow waits: whether to inject the header to `peer` now, which this op has sent none to; true
  // once per peer and op.
  bool probe_due(int peer);

  // Receives: true if `request`, a receive of `bytes` from `peer`, may be posted now; otherwise it
  // is kept until that peer's header agrees, and then listed in ready_receives().
  bool receive_ready(int peer, Request request, std::size_t bytes);

  // Headers: what `theirs`, just read from `peer`'s channel, means (see Verdict). kLater keeps
  // `peer` for the next begin_op; kAgrees and kEarlier list it in header_reposts().
  Verdict take_header(int peer, const CollectiveSignature& theirs);

  // What the transport posts at its next progress, in order; it erases what it posted.
  std::vector<Request>& ready_receives() { return ready_receives_; }
  std::vector<int>& header_reposts() { return header_reposts_; }

 private:
  struct PeerOpState {
    bool touched = false;  // listed in touched_peers_, reset at end_op
    bool header_sent = false;
    bool receiving = false;  // a receive from this peer was issued in this op
    bool header_valid = false;
    std::vector<Request> deferred;  // receives waiting for the header
  };
  PeerOpState& peer_state(int peer);

  DigestPolicy policy_;
  bool in_op_ = false;
  CollectiveSignature header_;  // this rank's, sent to a peer before its first message
  std::uint32_t sequence_ = 0;
  std::uint64_t digest_ = 0;
  std::vector<PeerOpState> peers_;
  std::vector<int> touched_peers_;
  std::vector<int> parked_headers_;  // peers whose channel holds a header for a later op
  std::vector<int> header_reposts_;  // peers whose channel waits to be reposted
  std::vector<Request> ready_receives_;
};

}  // namespace ddp::detail::fabric
