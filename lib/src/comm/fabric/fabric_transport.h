#pragma once
// PeerTransport on a libfabric RDM endpoint with manual progress. Every wait polls the one
// completion queue the endpoint owns; requests are tracked individually through their
// FI_CONTEXT2 contexts, so a completion that arrives while another request is awaited is simply
// recorded (never counted against the wrong wait). Every wait is bounded by the op's deadline.
// The class is one state machine in four files, one per concept:
//  - fabric_transport.cpp: requests and progress (slots, send/recv/wait, the completion queue);
//  - fabric_transport_agreement.cpp: the agreement protocol (below);
//  - fabric_transport_liveness.cpp: deadlines and peer liveness (with op_deadline.h);
//  - fabric_transport_teardown.cpp: failure and teardown (below).
//
// Agreement: ranks must check that they run the same collective before data lands where the
// other side did not mean it to. Two means, chosen per message:
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
// after a slow wait (kHeaderAfterIdle, which applies everywhere): rxm reports a message longer
// than its receive as a truncation, so the shm hazard above does not exist there, and a header
// message of its own would cost each op a send and a receive system call per peer. A provider
// without 8 bytes of CQ data sends the header before every first message and defers every
// receive until it agreed.
//
// On any failure (error completion, mismatch, timeout, peer exit, or an abort notice from a
// peer) the transport tells every peer with a control message (over ofi_rxm after an error
// completion, only those its connection is established with: see may_notify()), so their
// waits end too, closes its endpoint (over ofi_rxm leaves it open until the process exits: see
// the constructor) and refuses later ops. No libfabric call is made on it again, so nothing
// touches caller memory.
#include <chrono>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "comm/collectives/peer_transport.h"
#include "comm/fabric/fabric_endpoint.h"
#include "comm/fabric/op_deadline.h"
#include "comm/fabric/peer_liveness.h"
#include "comm/fabric/stuck_call_guard.h"

struct fi_cq_tagged_entry;

namespace ddp::detail::fabric {

class FabricTransport final : public collectives::PeerTransport {
 public:
  // `peers[r]` is rank r's fi_addr_t in the endpoint's address vector.
  FabricTransport(std::unique_ptr<FabricEndpoint> endpoint, std::vector<fi_addr_t> peers, int rank,
                  std::chrono::milliseconds timeout, PeerLiveness liveness);
  ~FabricTransport() override;

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(peers_.size()); }
  void begin_op(const CollectiveSignature& signature) override;
  void end_op() override;
  void expose(const void* data, std::size_t bytes) override;
  void* scratch(std::size_t bytes) override;
  Request send(int peer, std::uint32_t index, const void* data, std::size_t bytes) override;
  Request recv(int peer, std::uint32_t index, void* data, std::size_t bytes) override;
  void wait(Request request) override;
  std::size_t max_message_bytes() const override { return max_message_bytes_; }
  std::size_t eager_message_bytes() const override {
    return injects_small_sends_ ? inject_bytes_ : 0;
  }

  // Tells every peer, closes the endpoint.
  void abort(const std::string& reason) override { abandon(reason); }

 private:
  enum class SlotKind : std::uint8_t { kFree, kSend, kRecv, kHeader, kControl };
  struct Slot;
  struct PeerOpState {
    bool touched = false;  // listed in touched_peers_, reset at end_op
    bool header_sent = false;
    bool receiving = false;  // a receive from this peer was issued in this op
    bool header_valid = false;
    std::vector<Request> deferred;  // receives waiting for the header
  };
  struct AlignedDeleter {
    void operator()(char* p) const;
  };

  Request acquire(SlotKind kind, int peer, std::uint32_t index, std::size_t bytes);
  void release(Request request);
  PeerOpState& peer_state(int peer);

  // Reads the completion queue once; true if anything completed.
  bool progress();
  void complete(const fi_cq_tagged_entry& entry);
  [[noreturn]] void raise_completion_error();
  // Posts receives whose headers have arrived; keeps those the provider cannot take yet.
  void post_ready_receives();
  void post_receive(Request request);
  // The tag of a message of the current op sent by `source` (its header or its data).
  std::uint64_t op_tag(int source, std::uint32_t index, bool large = false) const;
  // Whether a data message of `bytes` carries the tag's large bit; sender and receiver must
  // decide alike.
  bool large_message(std::size_t bytes) const;
  // Whether a data message of `bytes` carries the op's digest as its CQ data.
  bool carries_digest(std::size_t bytes) const;
  void send_header(int peer);
  // Injects this op's header to `peer` after a slow wait (see kHeaderAfterIdle), untracked.
  void probe_with_header(int peer);
  // The tag of `source`'s header channel: sequence 0 and the header index, never a data tag.
  std::uint64_t header_tag(int source) const;
  // Acts on the header in `peer`'s channel buffer: checks one for this op (then reposts the
  // channel), keeps one for a later op, drops one for an earlier op.
  void take_header(int peer);
  // Reposts the header channels whose headers were used; keeps those the provider cannot take yet.
  void repost_header_channels();
  // Posts the receives `queue` names, in order, until the provider answers -FI_EAGAIN; keeps the
  // rest queued for the next progress.
  template <typename Entry, typename SlotOf>
  void post_queued_receives(std::vector<Entry>& queue, SlotOf&& slot_of, const char* what);
  // Posts a receive that lives as long as the communicator (before any op runs).
  void post_standing_receive(Slot& slot, std::uint64_t tag, std::uint64_t ignore);
  char* header_buffer(int peer) const;
  char* notice_buffer(std::size_t index) const;
  void* descriptor_for(const void* data, std::size_t bytes);
  // Posts through `post` (libfabric's `call`) until it stops answering -FI_EAGAIN, progressing in
  // between; `receive` says which queue it fills, for the error when that queue is too small.
  template <typename Post>
  void post_with_retry(const char* call, Post&& post, int peer, const char* what,
                       bool receive = false);
  // An empty poll at `now`: checks the awaited peers' liveness when due, and fails the op once its
  // deadline has passed.
  inline void check_deadline(Clock::time_point now, int peer, const char* waiting_for);
  [[noreturn]] void fail_deadline(int peer, const char* waiting_for);
  // Peers with a transfer of this op still in flight, indexed by rank.
  std::vector<bool> awaited_peers() const;
  // Fails the op if a peer it waits on has exited (same-host peers only).
  void check_awaited_peers_alive();

  void require_usable() const;
  // Builds the op's error, abandons the transport and throws it.
  [[noreturn]] void fail(int peer, const std::string& cause, bool timed_out = false);
  [[noreturn]] void fail_mismatch(int peer, const CollectiveSignature* theirs);
  // A libfabric call never returned (guarded()): fails the op, blaming an exited peer if any.
  [[noreturn]] void fail_stuck_call();
  const char* op_name() const { return to_string(header_.kind); }
  void abandon(const std::string& reason);
  void notify_peers(const std::string& reason);
  // Whether a best-effort notice may go to `peer` now (see notify_peers()).
  bool may_notify(int peer) const;
  // Reads and discards completions for `period`; false if the provider wedged.
  bool drain_quietly(std::chrono::milliseconds period);
  void release_fabric();
  // Leaks the fabric objects without touching them (wedged_ must be set).
  void abandon_silently();
  // Leaks the fabric objects and the memory they reference, closing nothing.
  void leak_fabric();
  // Runs one libfabric call, `name` ("fi_cq_read"), under the stuck-call guard; fails the op if
  // it never returns.
  template <typename Call>
  ssize_t guarded(const char* name, Call&& call);

  std::unique_ptr<StuckCallGuard> guard_;
  bool wedged_ = false;  // a call was abandoned: the endpoint must not be touched again
  // After a failure the endpoint is left open until the process exits (see abandon()).
  bool leaves_failed_endpoint_open_;
  std::unique_ptr<FabricEndpoint> endpoint_;
  std::vector<fi_addr_t> peers_;
  int rank_;
  OpDeadline deadline_;
  PeerLiveness liveness_;
  pid_t owner_;
  std::size_t inject_bytes_;
  std::size_t max_message_bytes_;
  bool is_shm_;
  bool rxm_ = false;  // ofi_rxm over a message provider (tcp;ofi_rxm)
  bool injects_small_sends_;
  // How long a wait spins before it starts yielding its core (see the constructor).
  std::chrono::microseconds spin_before_yield_;
  bool digests_in_cq_data_;  // ofi_rxm: no header messages (see above)
  bool small_digests_;       // elsewhere, with 8 bytes of CQ data: small messages carry digests
  std::uint64_t op_digest_ = 0;

  std::deque<Slot> slots_;  // stable addresses: libfabric holds pointers to their contexts
  std::vector<Request> op_requests_;  // taken since the op began (end_op waits for them)
  std::unique_ptr<std::deque<Slot>> leaked_slots_;
  std::vector<Request> free_slots_;
  std::vector<std::unique_ptr<Slot>> control_slots_;  // abort-notice receives
  std::vector<std::unique_ptr<Slot>> header_slots_;   // header channel receives, by peer
  std::vector<int> parked_headers_;  // peers whose channel holds a header for a later op
  std::vector<int> header_reposts_;  // peers whose channel waits to be reposted
  std::size_t notice_receives_ = 1;
  // Small registered area: one header channel buffer per peer (this rank's own stages the header
  // it sends), then the abort-notice buffers.
  std::unique_ptr<char, AlignedDeleter> control_area_;
  std::unique_ptr<MemoryRegistration> control_registration_;

  std::unique_ptr<char, AlignedDeleter> scratch_;
  std::size_t scratch_bytes_ = 0;
  std::unique_ptr<MemoryRegistration> scratch_registration_;
  std::vector<std::unique_ptr<MemoryRegistration>> op_registrations_;
  std::uint64_t next_key_ = 1;

  std::vector<PeerOpState> peer_states_;
  // Peers a message of this communicator completed with, by rank (over ofi_rxm: the peers its
  // connection to is established), and the peer an op's failure came from, if any.
  std::vector<bool> reached_;
  int failed_peer_ = -1;
  bool completion_failed_ = false;  // the provider reported an error completion
  std::vector<int> touched_peers_;
  std::vector<Request> ready_receives_;

  bool in_op_ = false;
  CollectiveSignature header_;  // this rank's, sent to every peer before its first message
  std::uint32_t sequence_ = 0;
  std::string failure_;
  // An abort notice from a peer that was already past the current op (see complete()).
  std::string pending_abort_;
  int pending_abort_peer_ = -1;
};

}  // namespace ddp::detail::fabric
