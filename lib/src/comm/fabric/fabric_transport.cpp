#include "comm/fabric/fabric_transport.h"

#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_tagged.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <type_traits>

#include "comm/fabric/message_tag.h"
#include "comm/fabric/stuck_call_guard.h"
#include "ddp/error.h"
#include "ddp/log.h"

namespace ddp::detail::fabric {
namespace {

using Clock = std::chrono::steady_clock;

constexpr std::size_t kNoticeBytes = 1024;
constexpr int kCompletionBatch = 16;
constexpr std::size_t kAlignment = 4096;
constexpr auto kLivenessInterval = std::chrono::milliseconds(100);
// How long an op may still run after a peer that was already past it aborted.
constexpr auto kAbortGrace = std::chrono::seconds(2);
// No single libfabric call legitimately burns this much CPU (messages are at most a chunk); one
// that does is spinning on a lock (see StuckCallGuard). Under ThreadSanitizer every copy the
// provider makes is checked against shadow memory, which multiplies the CPU a copy costs.
#if defined(__SANITIZE_THREAD__)
constexpr auto kStuckCallCpuLimit = std::chrono::milliseconds(10000);
#else
constexpr auto kStuckCallCpuLimit = std::chrono::milliseconds(1000);
#endif
// Best-effort calls once the endpoint is done with (abort notices, draining, closing) give up
// after this much wall time, blocked or not: the rank's own error waits on them.
constexpr auto kBestEffortCallLimit = kStuckCallCpuLimit;
// How long messages from a peer that has exited may still trickle in before its absence fails
// the op: this much wall time and this many polls in a row that found nothing, so that a rank
// descheduled through the window (ranks outnumbering cores) still reads what is already in its
// sockets.
constexpr auto kExitedPeerDrain = std::chrono::milliseconds(50);
constexpr int kExitedPeerDrainIdlePolls = 200;
// After waiting this long for a peer it has sent no header in this op, a rank injects it one:
// ranks that disagree about an all-small op may wait on tags the other never sends (a rank with
// an empty buffer runs a barrier, its peer a recursive doubling), and the header shows them the
// mismatch long before their timeout. Ranks that agree pay one small message per slow wait.
constexpr auto kHeaderAfterIdle = std::chrono::milliseconds(1);

static_assert(std::is_trivially_copyable_v<CollectiveSignature>, "headers travel as raw bytes");

// An abort notice: the sender's op sequence number, then why it gave up (text).
constexpr std::size_t kNoticeSequenceBytes = sizeof(std::uint32_t);

// What to add to a failed post's error when the provider's queue was full (ENOMEM, or EAGAIN
// that nothing cleared): its size and the variable that sets it. Ops keep a standing receive per
// peer plus a few dozen messages in flight (up to 32 eager pieces; the ring's receives posted
// ahead and sends 8 segments ahead), which the defaults (1024 and more) hold with room to spare.
std::string queue_full_hint(const fi_info& info, ssize_t rc, bool receive) {
  if (rc != -FI_ENOMEM && rc != -FI_EAGAIN) return "";
  // In "tcp;ofi_rxm" the queue that refused is the top layer's.
  std::string layer = info.fabric_attr->prov_name;
  layer = layer.substr(layer.find(';') == std::string::npos ? 0 : layer.find(';') + 1);
  for (char& c : layer) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  const std::size_t entries = receive ? info.rx_attr->size : info.tx_attr->size;
  return std::string("; the endpoint's ") + (receive ? "receive" : "send") + " queue is only " +
         std::to_string(entries) + " deep: unset or raise FI_" + layer +
         (receive ? "_RX_SIZE" : "_TX_SIZE");
}

// A time not yet taken: the clock is read only on empty polls. Most requests are complete by their
// first poll, and a small op waits on several: a 16 KiB allreduce on shm read the clock about 25
// times, at 25 ns a read on this VM (vDSO clock_gettime), a tenth of its time back to back.
constexpr Clock::time_point kNotYet = Clock::time_point::min();

// Waiting strategy: spin while completions are imminent, then yield the core (ranks may share
// cores with each other or with compute threads), then sleep in short naps. Polling only happens
// while a collective waits, never in the background.
class PollBackoff {
 public:
  explicit PollBackoff(std::chrono::microseconds spin) : spin_(spin) {}
  // Something completed: the next empty poll starts a new idle stretch.
  void reset() { idle_since_ = kNotYet; }
  // An empty poll at `now`.
  void pause(Clock::time_point now) {
    if (idle_since_ == kNotYet) {
      idle_since_ = now;
      return;
    }
    const auto idle = now - idle_since_;
    if (idle < spin_) return;
    if (idle < std::chrono::milliseconds(5)) {
      sched_yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

 private:
  std::chrono::microseconds spin_;
  Clock::time_point idle_since_ = kNotYet;
};

char* aligned_bytes(std::size_t bytes) {
  const std::size_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
  auto* p = static_cast<char*>(std::aligned_alloc(kAlignment, rounded));
  if (!p) throw std::bad_alloc();
  return p;
}

}  // namespace

struct FabricTransport::Slot {
  fi_context2 context;  // first: libfabric returns its address as the completion's op_context
  SlotKind kind;
  bool done;
  int peer;
  std::uint32_t index;
  std::size_t bytes;
  // What a deferred receive posts once its header has arrived.
  void* buffer;
  void* desc;
  std::uint64_t tag;
};

void FabricTransport::AlignedDeleter::operator()(char* p) const { std::free(p); }

FabricTransport::FabricTransport(std::unique_ptr<FabricEndpoint> endpoint,
                                 std::vector<fi_addr_t> peers, int rank,
                                 std::chrono::milliseconds timeout, PeerLiveness liveness)
    : endpoint_(std::move(endpoint)),
      peers_(std::move(peers)),
      rank_(rank),
      timeout_(timeout),
      liveness_(std::move(liveness)),
      owner_(::getpid()) {
  static_assert(std::is_standard_layout_v<Slot>,
                "Slot must be standard layout so that its context's address is its own");
  // A call still inside the provider after the op's whole timeout has failed the op anyway.
  guard_ = std::make_unique<StuckCallGuard>(kStuckCallCpuLimit, timeout_);
  const fi_info& info = endpoint_->info();
  inject_bytes_ = info.tx_attr->inject_size;
  max_message_bytes_ = std::max<std::size_t>(info.ep_attr->max_msg_size, 1);
  is_shm_ = std::strcmp(info.fabric_attr->prov_name, "shm") == 0;
  // libfabric 1.17's ofi_rxm can crash in fi_close when a peer that failed tore its connection
  // down during a rendezvous: its flush of the connection's completion queue reads a cancelled
  // entry whose context is gone (a segfault in rxm_handle_comp_error, about 1 in 250 failed
  // 3-4 rank collectives over tcp;ofi_rxm on a loaded machine). A failed communicator is never
  // used again, and the process closes its sockets when it exits, so there it stays open.
  const bool rxm = std::strstr(info.fabric_attr->prov_name, "ofi_rxm") != nullptr;
  leaves_failed_endpoint_open_ = rxm;
  // Over TCP the data moves only while the peer runs its progress too: a rank that yields its
  // core to a busy thread (training compute, or any CPU hog) for a time slice stalls both. With
  // a busy loop beside the ranks, 300 us of spinning before the first yield took a 64 KiB
  // allreduce from 1429 to 144 us and 1 MiB from 6506 to 2419 us; without it nothing changed. On
  // shm the longer spin made 1 MiB slower under the same load (848 vs 479 us), so shm keeps 50 us
  // (bench/results/2026-11-23-fabric-spin-under-load.txt).
  spin_before_yield_ = std::chrono::microseconds(rxm ? 300 : 50);
  const bool has_cq_data = info.domain_attr->cq_data_size >= sizeof(std::uint64_t);
  digests_in_cq_data_ = rxm && has_cq_data;
  small_digests_ = !rxm && has_cq_data;
  // Elsewhere an inject may still sit in a provider queue when fi_tinject returns, and would be
  // lost if this process exited right after its last collective; tracked sends are waited for.
  injects_small_sends_ = is_shm_;
  peer_states_.resize(peers_.size());

  // shm gets one exact-tag notice receive per peer: a receive with ignore bits, once completed,
  // can leave its mask on an entry shm reuses for unexpected messages and make them mismatch.
  // Elsewhere one receive that takes a notice from any peer is enough.
  notice_receives_ = is_shm_ ? peers_.size() : 1;
  // The notice receives' buffers, then one a notice too long to inject is sent from.
  const std::size_t control_bytes =
      sizeof(CollectiveSignature) * peers_.size() + kNoticeBytes * (notice_receives_ + 1);
  control_area_.reset(aligned_bytes(control_bytes));
  std::memset(control_area_.get(), 0, control_bytes);
  control_registration_ = std::make_unique<MemoryRegistration>(*endpoint_, control_area_.get(),
                                                               control_bytes, next_key_++, rank_);
  for (std::size_t i = 0; i < notice_receives_; ++i) {
    const int from = is_shm_ ? static_cast<int>(i) : -1;
    if (from == rank_) continue;
    control_slots_.push_back(std::make_unique<Slot>());
    Slot& s = *control_slots_.back();
    s.kind = SlotKind::kControl;
    s.peer = from;
    s.buffer = notice_buffer(i);
    s.bytes = kNoticeBytes;
    MessageTag tag;
    tag.control = true;
    tag.source = from < 0 ? 0 : static_cast<std::uint32_t>(from);
    post_standing_receive(s, encode_tag(tag), from < 0 ? kControlIgnoreBits : 0);
  }
  header_slots_.resize(peers_.size());
  for (int peer = 0; peer < size(); ++peer) {
    if (peer == rank_) continue;
    header_slots_[peer] = std::make_unique<Slot>();
    Slot& s = *header_slots_[peer];
    s.kind = SlotKind::kHeader;
    s.peer = peer;
    s.index = kHeaderIndex;
    s.buffer = header_buffer(peer);
    s.bytes = sizeof(CollectiveSignature);
    s.desc = control_registration_->descriptor();
    s.tag = header_tag(peer);
    post_standing_receive(s, s.tag, 0);
  }
}

char* FabricTransport::header_buffer(int peer) const {
  return control_area_.get() + sizeof(CollectiveSignature) * static_cast<std::size_t>(peer);
}

char* FabricTransport::notice_buffer(std::size_t index) const {
  return control_area_.get() + sizeof(CollectiveSignature) * peers_.size() + kNoticeBytes * index;
}

FabricTransport::~FabricTransport() {
  // In a forked child (a data loader worker, say) the endpoint's shared-memory region and
  // sockets still belong to the parent: closing them here could unlink the region or shut the
  // sockets down under the parent's communicator.
  if (::getpid() != owner_) {
    wedged_ = true;
    abandon_silently();
    // Its condition variable had a waiter in the parent: destroying it here would wait forever.
    (void)guard_.release();
    return;
  }
  release_fabric();
}

void FabricTransport::abandon_silently() {
  failure_ = "the communicator belongs to another process";
  release_fabric();
}

void FabricTransport::release_fabric() {
  if (!endpoint_) return;
  if (!wedged_) {
    // The endpoint goes first, so nothing still posted can touch memory released below.
    FabricEndpoint* endpoint = endpoint_.get();
    if (guard_->run([endpoint] { endpoint->close_endpoint(); }, kBestEffortCallLimit)) {
      op_registrations_.clear();
      scratch_registration_.reset();
      control_registration_.reset();
      endpoint_.reset();
      return;
    }
    wedged_ = true;
  }
  // A provider call never returned (or the objects belong to the parent of this forked
  // process): closing could hang or break the owner.
  leak_fabric();
}

void FabricTransport::leak_fabric() {
  for (auto& registration : op_registrations_) (void)registration.release();
  (void)scratch_registration_.release();
  (void)control_registration_.release();
  (void)scratch_.release();
  (void)control_area_.release();
  (void)endpoint_.release();
  for (auto& slot : control_slots_) (void)slot.release();
  for (auto& slot : header_slots_) (void)slot.release();
  leaked_slots_ = std::make_unique<std::deque<Slot>>(std::move(slots_));
  (void)leaked_slots_.release();
}

template <typename Call>
ssize_t FabricTransport::guarded(Call&& call) {
  ssize_t rc = 0;
  if (!guard_->run([&] { rc = call(); })) {
    wedged_ = true;
    // Blame a peer this op waits on first: others may have exited normally by now.
    auto dead = liveness_.first_exited(awaited_peers());
    if (!dead) dead = liveness_.first_exited(std::vector<bool>(peers_.size(), true));
    fail(dead.value_or(-1),
         "a libfabric call " + guard_->last_abandoned_reason() + " without returning" +
             (dead ? "; rank " + std::to_string(*dead) +
                         " exited on this host, apparently inside the provider's shared-memory "
                         "critical section"
                   : std::string("; the provider is stuck")));
  }
  return rc;
}

void FabricTransport::post_standing_receive(Slot& s, std::uint64_t tag, std::uint64_t ignore) {
  void* desc = control_registration_->descriptor();
  fid_ep* ep = endpoint_->endpoint();
  const auto deadline = Clock::now() + timeout_;
  PollBackoff backoff(spin_before_yield_);
  for (;;) {
    const ssize_t rc = guarded([&] {
      return fi_trecv(ep, s.buffer, s.bytes, desc, FI_ADDR_UNSPEC, tag, ignore, &s.context);
    });
    if (rc == 0) return;
    if (rc != -FI_EAGAIN || Clock::now() >= deadline) {
      throw CommError("connect", rank_, -1,
                      std::string("posting ") +
                          (s.kind == SlotKind::kHeader ? "a header-channel" : "an abort-notice") +
                          " receive failed: " + fabric_error_text(rc) +
                          (rc == -FI_EAGAIN ? " for the whole timeout" : "") +
                          queue_full_hint(endpoint_->info(), rc, true));
    }
    // Only standing receives are posted yet: a header that completes one is parked for its op.
    if (progress()) {
      backoff.reset();
      continue;
    }
    backoff.pause(Clock::now());
  }
}

collectives::PeerTransport::Request FabricTransport::acquire(SlotKind kind, int peer,
                                                             std::uint32_t index,
                                                             std::size_t bytes) {
  Request request;
  if (free_slots_.empty()) {
    request = static_cast<Request>(slots_.size());
    slots_.emplace_back();
  } else {
    request = free_slots_.back();
    free_slots_.pop_back();
  }
  op_requests_.push_back(request);
  // Every field but the context, which the provider owns while the request is posted.
  Slot& s = slots_[request];
  s.kind = kind;
  s.done = false;
  s.peer = peer;
  s.index = index;
  s.bytes = bytes;
  s.buffer = nullptr;
  s.desc = nullptr;
  s.tag = 0;
  return request;
}

void FabricTransport::release(Request request) {
  slots_[request].kind = SlotKind::kFree;
  free_slots_.push_back(request);
}

FabricTransport::PeerOpState& FabricTransport::peer_state(int peer) {
  PeerOpState& state = peer_states_[peer];
  if (!state.touched) {
    state.touched = true;
    touched_peers_.push_back(peer);
  }
  return state;
}

void FabricTransport::require_usable() const {
  if (!failure_.empty()) {
    throw CommError(op_name(), rank_, -1,
                    "the fabric communicator is unusable after an earlier failure (" + failure_ +
                        "); recreate the communicator or restart the job");
  }
}

void FabricTransport::begin_op(const CollectiveSignature& signature) {
  header_ = signature;
  require_usable();
  if (!pending_abort_.empty()) fail(pending_abort_peer_, pending_abort_);
  in_op_ = true;
  ++sequence_;
  header_.sequence = sequence_;
  op_digest_ = header_.digest();
  op_clock_started_ = false;  // at the op's first empty poll (see check_deadline)
  if (!parked_headers_.empty()) {
    std::vector<int> parked;
    parked.swap(parked_headers_);
    for (int peer : parked) take_header(peer);  // parks again those still ahead
  }
  if (!header_reposts_.empty()) repost_header_channels();
}

void FabricTransport::end_op() {
  // Only this op's requests: slots_ keeps as many as the largest op ever needed. A slot released
  // and taken again within the op is listed twice; the second visit finds it free.
  for (Request request : op_requests_) {
    const SlotKind kind = slots_[request].kind;
    if (kind == SlotKind::kSend || kind == SlotKind::kRecv) wait(request);
  }
  op_requests_.clear();
  for (int peer : touched_peers_) peer_states_[peer] = PeerOpState{};
  touched_peers_.clear();
  op_registrations_.clear();
  in_op_ = false;
}

void FabricTransport::expose(const void* data, std::size_t bytes) {
  require_usable();
  if (bytes == 0) return;
  try {
    op_registrations_.push_back(
        std::make_unique<MemoryRegistration>(*endpoint_, data, bytes, next_key_++, rank_));
  } catch (const CommError& e) {
    fail(-1, e.what());
  }
}

void* FabricTransport::scratch(std::size_t bytes) {
  require_usable();
  if (bytes > scratch_bytes_) {
    const std::size_t grown = std::max(bytes, scratch_bytes_ * 2);
    scratch_registration_.reset();
    scratch_.reset(aligned_bytes(grown));
    scratch_bytes_ = grown;
    try {
      scratch_registration_ = std::make_unique<MemoryRegistration>(*endpoint_, scratch_.get(),
                                                                   grown, next_key_++, rank_);
    } catch (const CommError& e) {
      scratch_bytes_ = 0;
      fail(-1, e.what());
    }
  }
  return scratch_.get();
}

void* FabricTransport::descriptor_for(const void* data, std::size_t bytes) {
  if (bytes == 0) return nullptr;
  if (scratch_registration_ && scratch_registration_->contains(data, bytes)) {
    return scratch_registration_->descriptor();
  }
  for (const auto& registration : op_registrations_) {
    if (registration->contains(data, bytes)) return registration->descriptor();
  }
  fail(-1, "internal error: a transfer uses memory that was never registered");
}

void FabricTransport::check_deadline(Clock::time_point now, int peer, const char* waiting_for) {
  if (!op_clock_started_) start_op_clock(now);
  if (now >= next_liveness_check_) {
    next_liveness_check_ = now + kLivenessInterval;
    check_awaited_peers_alive();
  }
  if (now >= deadline_) {
    if (!pending_abort_.empty()) fail(pending_abort_peer_, pending_abort_);
    fail(peer,
         std::string("no progress within the ") + std::to_string(timeout_.count()) +
             " ms timeout while waiting for " + waiting_for + " rank " + std::to_string(peer) +
             "; that rank is dead, stuck, or issued a different collective",
         /*timed_out=*/true);
  }
}

void FabricTransport::start_op_clock(Clock::time_point now) {
  op_clock_started_ = true;
  deadline_ = now + timeout_;
  next_liveness_check_ = now + kLivenessInterval;
}

std::vector<bool> FabricTransport::awaited_peers() const {
  std::vector<bool> awaited(peers_.size(), false);
  for (const Slot& s : slots_) {
    const bool in_flight = s.kind == SlotKind::kSend || s.kind == SlotKind::kRecv;
    if (in_flight && !s.done && s.peer >= 0) awaited[s.peer] = true;
  }
  return awaited;
}

void FabricTransport::check_awaited_peers_alive() {
  // Only peers this op still waits on: a peer that finished its part may exit (the end of a
  // job), and one that is not involved is no reason to fail.
  const auto dead = liveness_.first_exited(awaited_peers());
  if (!dead) return;
  // What it sent before it went may still be on its way: take that first.
  const auto until = Clock::now() + kExitedPeerDrain;
  int idle_polls = 0;
  while (awaited_peers()[*dead] &&
         (idle_polls < kExitedPeerDrainIdlePolls || Clock::now() < until)) {
    idle_polls = progress() ? 0 : idle_polls + 1;
  }
  if (!awaited_peers()[*dead]) return;
  fail(*dead, "rank " + std::to_string(*dead) + " (pid " +
                  std::to_string(*liveness_.pid_of(*dead)) +
                  " on this host) exited during the collective");
}

template <typename Post>
void FabricTransport::post_with_retry(Post&& post, int peer, const char* what, bool receive) {
  PollBackoff backoff(spin_before_yield_);
  for (;;) {
    const ssize_t rc = guarded(post);
    if (rc == 0) return;
    if (rc != -FI_EAGAIN) {
      fail(peer, std::string(what) + " rank " + std::to_string(peer) + " could not be posted: " +
                     fabric_error_text(rc) + queue_full_hint(endpoint_->info(), rc, receive));
    }
    // The queues are full: completions free them.
    if (progress()) {
      backoff.reset();
      continue;
    }
    const auto now = Clock::now();
    check_deadline(now, peer, what);
    backoff.pause(now);
  }
}

std::uint64_t FabricTransport::op_tag(int source, std::uint32_t index, bool large) const {
  MessageTag tag;
  tag.large = large;
  tag.sequence = sequence_;
  tag.source = static_cast<std::uint32_t>(source);
  tag.index = index;
  return encode_tag(tag);
}

bool FabricTransport::large_message(std::size_t bytes) const {
  // With digests the ranks may disagree on the size before anything shows it: the tags must
  // match regardless, so the size bit stays clear.
  return bytes > inject_bytes_ && !digests_in_cq_data_;
}

bool FabricTransport::carries_digest(std::size_t bytes) const {
  return digests_in_cq_data_ || (small_digests_ && !large_message(bytes));
}

std::uint64_t FabricTransport::header_tag(int source) const {
  MessageTag tag;
  tag.source = static_cast<std::uint32_t>(source);
  tag.index = kHeaderIndex;
  return encode_tag(tag);
}

void FabricTransport::send_header(int peer) {
  const std::uint64_t bits = header_tag(rank_);
  const CollectiveSignature& header = header_;
  fid_ep* ep = endpoint_->endpoint();
  const fi_addr_t destination = peers_[peer];
  if (injects_small_sends_ && sizeof(header) <= inject_bytes_) {
    post_with_retry([&] { return fi_tinject(ep, &header, sizeof(header), destination, bits); },
                    peer, "an op header to");
    return;
  }
  // Every header of an op is the same, so the peers' sends can share this rank's slot; end_op
  // waits for them before the next op rewrites it.
  char* staged = header_buffer(rank_);
  std::memcpy(staged, &header, sizeof(header));
  const Request request = acquire(SlotKind::kSend, peer, kHeaderIndex, sizeof(header));
  void* desc = control_registration_->descriptor();
  void* context = &slots_[request].context;
  post_with_retry(
      [&] { return fi_tsend(ep, staged, sizeof(header), desc, destination, bits, context); }, peer,
      "an op header to");
}

void FabricTransport::probe_with_header(int peer) {
  // Best effort, and nothing this op must wait for: the peer may have finished and exited (a
  // broadcast's root), where a tracked send would fail the op. Headers fit every local
  // provider's inject size (48 bytes; tcp;ofi_rxm injects 64).
  if (sizeof(CollectiveSignature) > inject_bytes_) return;
  if (auto pid = liveness_.pid_of(peer); pid && process_exiting(*pid)) return;
  const CollectiveSignature& header = header_;
  const std::uint64_t bits = header_tag(rank_);
  fid_ep* ep = endpoint_->endpoint();
  const fi_addr_t destination = peers_[peer];
  guarded([&] { return fi_tinject(ep, &header, sizeof(header), destination, bits); });
}

void FabricTransport::take_header(int peer) {
  CollectiveSignature theirs;
  std::memcpy(&theirs, header_buffer(peer), sizeof(theirs));
  const auto ahead =
      static_cast<std::int32_t>(static_cast<std::uint32_t>(theirs.sequence) - sequence_);
  if (ahead > 0 || (ahead == 0 && !in_op_)) {
    parked_headers_.push_back(peer);  // the channel stays unposted until this rank gets there
    return;
  }
  if (ahead == 0) {
    if (!theirs.agrees_with(header_)) fail_mismatch(peer, &theirs);
    PeerOpState& state = peer_state(peer);
    state.header_valid = true;
    ready_receives_.insert(ready_receives_.end(), state.deferred.begin(), state.deferred.end());
    state.deferred.clear();
  }
  // A header for an op this rank completed came after every message it received from the peer
  // in that op had been checked: nothing is left for it to protect.
  header_reposts_.push_back(peer);
}

void FabricTransport::repost_header_channels() {
  post_queued_receives(
      header_reposts_, [this](int peer) -> Slot& { return *header_slots_[peer]; },
      "the header channel from");
}

template <typename Entry, typename SlotOf>
void FabricTransport::post_queued_receives(std::vector<Entry>& queue, SlotOf&& slot_of,
                                           const char* what) {
  fid_ep* ep = endpoint_->endpoint();
  std::size_t posted = 0;
  for (; posted < queue.size(); ++posted) {
    Slot& s = slot_of(queue[posted]);
    const ssize_t rc = guarded([&] {
      return fi_trecv(ep, s.buffer, s.bytes, s.desc, FI_ADDR_UNSPEC, s.tag, 0, &s.context);
    });
    if (rc == -FI_EAGAIN) break;  // the next progress tries again
    if (rc != 0) {
      fail(s.peer, std::string(what) + " rank " + std::to_string(s.peer) +
                       " could not be posted: " + fabric_error_text(rc) +
                       queue_full_hint(endpoint_->info(), rc, true));
    }
  }
  queue.erase(queue.begin(), queue.begin() + static_cast<std::ptrdiff_t>(posted));
}

void FabricTransport::post_receive(Request request) {
  Slot& s = slots_[request];
  fid_ep* ep = endpoint_->endpoint();
  post_with_retry(
      [&] { return fi_trecv(ep, s.buffer, s.bytes, s.desc, FI_ADDR_UNSPEC, s.tag, 0, &s.context); },
      s.peer, "a receive from", true);
}

void FabricTransport::post_ready_receives() {
  post_queued_receives(
      ready_receives_, [this](Request request) -> Slot& { return slots_[request]; },
      "a receive from");
}

collectives::PeerTransport::Request FabricTransport::send(int peer, std::uint32_t index,
                                                          const void* data, std::size_t bytes) {
  require_usable();
  PeerOpState& state = peer_state(peer);
  const bool large = large_message(bytes);
  const bool digest = carries_digest(bytes);
  // See fabric_transport.h: the header goes ahead of a message without a digest, and ahead of a
  // small one to a peer this rank receives nothing from (yet), which may expect a large one.
  if (!state.header_sent && !digests_in_cq_data_ && (!digest || !state.receiving)) {
    state.header_sent = true;
    send_header(peer);
  }
  const std::uint64_t bits = op_tag(rank_, data_index(index), large);
  fid_ep* ep = endpoint_->endpoint();
  const fi_addr_t destination = peers_[peer];
  const std::uint64_t op_digest = op_digest_;
  if (!large && injects_small_sends_) {
    // Written into the peer's shared memory before returning; no completion is generated.
    if (digest) {
      post_with_retry([&] { return fi_tinjectdata(ep, data, bytes, op_digest, destination, bits); },
                      peer, "a send to");
    } else {
      post_with_retry([&] { return fi_tinject(ep, data, bytes, destination, bits); }, peer,
                      "a send to");
    }
    const Request request = acquire(SlotKind::kSend, peer, index, bytes);
    slots_[request].done = true;
    return request;
  }
  void* desc = descriptor_for(data, bytes);
  const Request request = acquire(SlotKind::kSend, peer, index, bytes);
  void* context = &slots_[request].context;
  if (digest) {
    post_with_retry(
        [&] { return fi_tsenddata(ep, data, bytes, desc, op_digest, destination, bits, context); },
        peer, "a send to");
    return request;
  }
  post_with_retry([&] { return fi_tsend(ep, data, bytes, desc, destination, bits, context); }, peer,
                  "a send to");
  return request;
}

collectives::PeerTransport::Request FabricTransport::recv(int peer, std::uint32_t index, void* data,
                                                          std::size_t bytes) {
  require_usable();
  PeerOpState& state = peer_state(peer);
  state.receiving = true;
  const bool large = large_message(bytes);
  void* desc = descriptor_for(data, bytes);
  const Request request = acquire(SlotKind::kRecv, peer, index, bytes);
  Slot& s = slots_[request];
  s.buffer = data;
  s.desc = desc;
  s.tag = op_tag(peer, data_index(index), large);
  // A message without a digest waits for the header: only then is its size known to match the
  // sender's.
  if (!carries_digest(bytes) && !state.header_valid) {
    state.deferred.push_back(request);
  } else {
    post_receive(request);
  }
  return request;
}

void FabricTransport::wait(Request request) {
  require_usable();
  Slot& s = slots_[request];
  PollBackoff backoff(spin_before_yield_);
  auto header_due = kNotYet;  // kHeaderAfterIdle after this wait's first empty poll
  while (!s.done) {
    if (progress()) {
      backoff.reset();
      continue;
    }
    const auto now = Clock::now();
    check_deadline(now, s.peer, s.kind == SlotKind::kSend ? "a send to" : "a message from");
    if (header_due == kNotYet) header_due = now + kHeaderAfterIdle;
    if (now >= header_due && !peer_states_[s.peer].header_sent) {
      peer_state(s.peer).header_sent = true;
      probe_with_header(s.peer);
    }
    backoff.pause(now);
  }
  release(request);
}

bool FabricTransport::progress() {
  fi_cq_tagged_entry entries[kCompletionBatch];
  fid_cq* cq = endpoint_->completion_queue();
  const ssize_t count = guarded([&] { return fi_cq_read(cq, entries, kCompletionBatch); });
  if (count > 0) {
    for (ssize_t i = 0; i < count; ++i) complete(entries[i]);
    if (!ready_receives_.empty()) post_ready_receives();
    if (!header_reposts_.empty()) repost_header_channels();
    return true;
  }
  if (!ready_receives_.empty()) post_ready_receives();
  if (!header_reposts_.empty()) repost_header_channels();
  if (count == -FI_EAGAIN) return false;
  if (count == -FI_EAVAIL) raise_completion_error();
  fail(-1, "reading the completion queue failed: " + fabric_error_text(count));
}

void FabricTransport::complete(const fi_cq_tagged_entry& entry) {
  Slot& s = *reinterpret_cast<Slot*>(entry.op_context);
  switch (s.kind) {
    case SlotKind::kControl: {
      const int source = static_cast<int>(decode_tag(entry.tag).source);
      const std::size_t length = std::min(entry.len, kNoticeBytes);
      std::uint32_t their_sequence = sequence_;
      std::string text;
      if (length >= kNoticeSequenceBytes) {
        std::memcpy(&their_sequence, s.buffer, kNoticeSequenceBytes);
        text.assign(static_cast<const char*>(s.buffer) + kNoticeSequenceBytes,
                    length - kNoticeSequenceBytes);
      }
      const std::string cause = "rank " + std::to_string(source) +
                                " aborted the job's collectives" +
                                (text.empty() ? std::string() : ": " + text);
      // A rank that failed in a later op has finished this one: what it owed this rank is on
      // its way, so let this op complete (briefly) and fail the next one instead.
      const std::uint32_t ahead = their_sequence - sequence_;
      if (in_op_ && ahead != 0 && ahead < (1u << 31)) {
        pending_abort_peer_ = source;
        pending_abort_ = cause;
        const auto now = Clock::now();
        if (!op_clock_started_) start_op_clock(now);
        deadline_ = std::min(deadline_, now + kAbortGrace);
        s.done = true;
        return;
      }
      fail(source, cause);
    }
    case SlotKind::kHeader:
      if (entry.len != sizeof(CollectiveSignature)) fail_mismatch(s.peer, nullptr);
      take_header(s.peer);
      return;  // a standing receive: never "done"
    case SlotKind::kRecv:
      if (entry.len != s.bytes) {
        fail(s.peer, "rank " + std::to_string(s.peer) + " sent " + std::to_string(entry.len) +
                         " bytes where this rank expected " + std::to_string(s.bytes) +
                         "; the ranks passed buffers of different sizes");
      }
      if (carries_digest(s.bytes) &&
          (!(entry.flags & FI_REMOTE_CQ_DATA) || entry.data != op_digest_)) {
        fail(s.peer, "rank " + std::to_string(s.peer) + " issued another collective than this " +
                         "rank's " + describe(header_) +
                         " (another kind, type, element count, op, root, or DDP_FABRIC_* "
                         "setting); every rank must issue the same collectives in the same "
                         "order");
      }
      break;
    default:
      break;
  }
  s.done = true;
}

void FabricTransport::fail_mismatch(int peer, const CollectiveSignature* theirs) {
  fail(peer, theirs ? mismatch_message(header_, *theirs, peer)
                    : "rank " + std::to_string(peer) +
                          " sent an op header of the wrong size; is it running another version "
                          "of this library?");
}

void FabricTransport::raise_completion_error() {
  fi_cq_err_entry error{};  // zeroed: err_data_size 0 asks the provider for its own buffer
  fid_cq* cq = endpoint_->completion_queue();
  const ssize_t read = guarded([&] { return fi_cq_readerr(cq, &error, 0); });
  if (read != 1) fail(-1, "fi_cq_readerr failed: " + fabric_error_text(read));
  char provider_text[256] = {0};
  const char* detail = fi_cq_strerror(endpoint_->completion_queue(), error.prov_errno,
                                      error.err_data, provider_text, sizeof(provider_text));
  const int code = std::abs(error.err);  // some providers report it negated
  const std::string message =
      fabric_error_text(code) +
      (detail && *detail ? std::string(", provider says: ") + detail : std::string());
  Slot* s = static_cast<Slot*>(error.op_context);
  if (!s) fail(-1, "libfabric reported " + message);
  if (s->kind == SlotKind::kControl) {
    const MessageTag tag = decode_tag(error.tag);
    fail(static_cast<int>(tag.source),
         "rank " + std::to_string(tag.source) + " aborted the job's collectives");
  }
  if (code == FI_ETRUNC) {
    if (s->kind == SlotKind::kHeader) {
      fail(s->peer, "rank " + std::to_string(s->peer) +
                        " sent an op header of another size; is it running another version of "
                        "this library?");
    }
    fail(s->peer, "rank " + std::to_string(s->peer) + " sent more than the " +
                      std::to_string(s->bytes) +
                      " bytes this rank expected; the ranks passed buffers of different sizes");
  }
  const char* direction = s->kind == SlotKind::kSend ? "a send to" : "a receive from";
  fail(s->peer, std::string("libfabric failed ") + direction + " rank " + std::to_string(s->peer) +
                    ": " + message);
}

void FabricTransport::fail(int peer, const std::string& cause, bool timed_out) {
  const std::string op = op_name();
  if (timed_out) {
    TimeoutError error(op, rank_, peer, cause);
    abandon(error.what());
    throw error;
  }
  CommError error(op, rank_, peer, cause);
  abandon(error.what());
  throw error;
}

void FabricTransport::abandon(const std::string& reason) {
  if (!failure_.empty() || !endpoint_) return;
  failure_ = reason;
  log::debug("fabric: abandoning the endpoint: {}", reason);
  if (!wedged_) notify_peers(reason);
  if (leaves_failed_endpoint_open_ && !wedged_) {
    log::debug("fabric: leaving the failed {} endpoint open until the process exits",
               endpoint_->info().fabric_attr->prov_name);
    return leak_fabric();
  }
  release_fabric();
}

void FabricTransport::notify_peers(const std::string& reason) {
  // Tell every peer, so that ranks waiting on this one (or on others) stop now rather than at
  // their timeout. Best effort: a peer that is gone simply never reads it.
  MessageTag tag;
  tag.control = true;
  tag.source = static_cast<std::uint32_t>(rank_);
  const std::uint64_t bits = encode_tag(tag);
  std::string notice(kNoticeSequenceBytes, '\0');
  std::memcpy(notice.data(), &sequence_, kNoticeSequenceBytes);
  notice += reason;
  notice.resize(std::min(notice.size(), kNoticeBytes));
  // Where the provider injects less (64 bytes over tcp;ofi_rxm) the notice is sent from the
  // registered control area instead, so that the peers read the whole reason.
  const bool injected = notice.size() <= inject_bytes_;
  char* staged = notice_buffer(notice_receives_);
  std::memcpy(staged, notice.data(), notice.size());
  void* desc = control_registration_->descriptor();
  fid_ep* ep = endpoint_->endpoint();
  const std::size_t length = notice.size();
  const auto give_up = Clock::now() + std::chrono::milliseconds(100);
  for (int peer = 0; peer < size(); ++peer) {
    if (peer == rank_) continue;
    // A peer killed inside shm's critical section leaves its region locked: skip known-dead
    // peers rather than wait for the stuck-call guard; and peers on their way out, whose
    // connections ofi_rxm may be tearing down (sending on one crashed it).
    if (auto pid = liveness_.pid_of(peer); pid && process_exiting(*pid)) continue;
    const fi_addr_t destination = peers_[peer];
    void* context = injected ? nullptr : &slots_[acquire(SlotKind::kSend, peer, 0, length)].context;
    for (;;) {
      ssize_t rc = 0;
      if (!guard_->run(
              [&] {
                rc = injected ? fi_tinject(ep, staged, length, destination, bits)
                              : fi_tsend(ep, staged, length, desc, destination, bits, context);
              },
              kBestEffortCallLimit)) {
        wedged_ = true;
        return;
      }
      if (rc != -FI_EAGAIN || Clock::now() >= give_up) break;
      if (!drain_quietly(std::chrono::milliseconds(0))) return;
    }
  }
  // shm delivers an inject before returning; socket providers need progress to send.
  if (!is_shm_) drain_quietly(std::chrono::milliseconds(20));
}

bool FabricTransport::drain_quietly(std::chrono::milliseconds period) {
  fid_cq* cq = endpoint_->completion_queue();
  const auto until = Clock::now() + period;
  do {
    fi_cq_tagged_entry entries[kCompletionBatch];
    ssize_t rc = 0;
    if (!guard_->run([&] { rc = fi_cq_read(cq, entries, kCompletionBatch); },
                     kBestEffortCallLimit)) {
      wedged_ = true;
      return false;
    }
    if (rc == -FI_EAVAIL) {
      fi_cq_err_entry error{};
      if (!guard_->run([&] { rc = fi_cq_readerr(cq, &error, 0); }, kBestEffortCallLimit)) {
        wedged_ = true;
        return false;
      }
    }
  } while (Clock::now() < until);
  return true;
}

}  // namespace ddp::detail::fabric
