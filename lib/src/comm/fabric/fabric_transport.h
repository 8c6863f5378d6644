#pragma once
// PeerTransport on a libfabric RDM endpoint with manual progress. Every wait polls the one
// completion queue the endpoint owns; requests are tracked individually through their
// FI_CONTEXT2 contexts, so a completion that arrives while another request is awaited is simply
// recorded (never counted against the wrong wait). Every wait is bounded by the op's deadline.
// Its two protocols are collaborators it owns, with narrow interfaces:
//  - Agreement (agreement.h): the ranks check that they run the same collective before data lands
//    where the other side did not mean it to. It decides tags, digests, when a header goes out
//    and when a receive may be posted; it makes no libfabric call.
//  - Teardown (teardown.h): what failed, which peers to tell, the abort notices and the closing
//    of the endpoint, each call bounded by the stuck-call guard.
// The transport's own files:
//  - fabric_transport.cpp: requests and progress (slots, send/recv/wait, the completion queue);
//  - fabric_transport_agreement.cpp: carrying out the agreement's decisions (header sends, the
//    header channels, deferred receives);
//  - fabric_transport_liveness.cpp: deadlines and peer liveness (with op_deadline.h);
//  - fabric_transport_teardown.cpp: failing an op, and the order in which its objects are closed
//    or leaked.
#include <chrono>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "comm/collectives/peer_transport.h"
#include "comm/fabric/agreement.h"
#include "comm/fabric/fabric_endpoint.h"
#include "comm/fabric/op_deadline.h"
#include "comm/fabric/peer_liveness.h"
#include "comm/fabric/stuck_call_guard.h"
#include "comm/fabric/teardown.h"

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
  struct AlignedDeleter {
    void operator()(char* p) const;
  };

  Request acquire(SlotKind kind, int peer, std::uint32_t index, std::size_t bytes);
  void release(Request request);

  // Reads the completion queue once; true if anything completed.
  bool progress();
  void complete(const fi_cq_tagged_entry& entry);
  [[noreturn]] void raise_completion_error();
  // Whether an error completion's code says the peer's connection went away.
  static bool connection_lost(int code);
  // Why `peer`'s connection went away: its exit, where this host sees it, or its giving up.
  std::string peer_gone(int peer) const;
  // Posts receives whose headers have arrived; keeps those the provider cannot take yet.
  void post_ready_receives();
  void post_receive(Request request);
  // A control notice from a peer: fails the op, or defers its failure (Teardown::defer).
  void take_notice(const Slot& slot, const fi_cq_tagged_entry& entry);
  void check_received(const Slot& slot, const fi_cq_tagged_entry& entry);
  void send_header(int peer);
  // Injects this op's header to `peer` after a slow wait (see kHeaderAfterIdle), untracked.
  void probe_with_header(int peer);
  // Acts on the header in `peer`'s channel buffer, as the agreement judges it.
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
  // "rank N (pid P on this host) exited during the collective", for a watched peer.
  std::string exited_during_op(int peer) const;

  void require_usable() const;
  // Builds the op's error, abandons the transport and throws it.
  [[noreturn]] void fail(int peer, const std::string& cause, bool timed_out = false);
  [[noreturn]] void fail_mismatch(int peer, const CollectiveSignature* theirs);
  // A libfabric call never returned (guarded()): fails the op, blaming an exited peer if any.
  [[noreturn]] void fail_stuck_call();
  const char* op_name() const { return to_string(agreement_.header().kind); }
  void abandon(const std::string& reason);
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
  Agreement agreement_;
  OpDeadline deadline_;
  PeerLiveness liveness_;
  pid_t owner_;
  std::size_t inject_bytes_;
  std::size_t max_message_bytes_;
  bool is_shm_;
  bool injects_small_sends_;
  // How long a wait spins before it starts yielding its core (see the constructor).
  std::chrono::microseconds spin_before_yield_;
  std::unique_ptr<Teardown> teardown_;  // after liveness_ and guard_, which it refers to

  std::deque<Slot> slots_;  // stable addresses: libfabric holds pointers to their contexts
  std::vector<Request> op_requests_;  // taken since the op began (end_op waits for them)
  std::unique_ptr<std::deque<Slot>> leaked_slots_;
  std::vector<Request> free_slots_;
  std::vector<std::unique_ptr<Slot>> control_slots_;  // abort-notice receives
  std::vector<std::unique_ptr<Slot>> header_slots_;   // header channel receives, by peer
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
};

}  // namespace ddp::detail::fabric
