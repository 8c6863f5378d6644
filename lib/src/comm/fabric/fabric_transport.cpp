#include "comm/fabric/fabric_transport.h"

#include <rdma/fi_eq.h>
#include <rdma/fi_tagged.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "comm/fabric/fabric_transport_internal.h"
#include "comm/fabric/message_tag.h"
#include "comm/fabric/stuck_call_guard.h"
#include "ddp/error.h"

// Requests and progress: the endpoint's set-up, the request slots, send/recv/wait, and the
// completion queue. The agreement protocol, deadlines and teardown live in the files
// fabric_transport_internal.h names.
namespace ddp::detail::fabric {
namespace {

constexpr std::size_t kAlignment = 4096;

// ofi_rxm over a message provider (tcp;ofi_rxm).
bool is_rxm(const fi_info& info) {
  return std::strstr(info.fabric_attr->prov_name, "ofi_rxm") != nullptr;
}

DigestPolicy digest_policy(const fi_info& info) {
  const bool rxm = is_rxm(info);
  const bool has_cq_data = info.domain_attr->cq_data_size >= sizeof(std::uint64_t);
  DigestPolicy policy;
  policy.inject_bytes = info.tx_attr->inject_size;
  policy.digests_in_cq_data = rxm && has_cq_data;
  policy.small_digests = !rxm && has_cq_data;
  return policy;
}

char* aligned_bytes(std::size_t bytes) {
  const std::size_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
  auto* p = static_cast<char*>(std::aligned_alloc(kAlignment, rounded));
  if (!p) throw std::bad_alloc();
  return p;
}

}  // namespace

void FabricTransport::AlignedDeleter::operator()(char* p) const { std::free(p); }

FabricTransport::FabricTransport(std::unique_ptr<FabricEndpoint> endpoint,
                                 std::vector<fi_addr_t> peers, int rank,
                                 std::chrono::milliseconds timeout, PeerLiveness liveness)
    : endpoint_(std::move(endpoint)),
      peers_(std::move(peers)),
      rank_(rank),
      agreement_(static_cast<int>(peers_.size()), digest_policy(endpoint_->info())),
      deadline_(timeout, kLivenessInterval),
      liveness_(std::move(liveness)),
      owner_(::getpid()) {
  static_assert(std::is_standard_layout_v<Slot>,
                "Slot must be standard layout so that its context's address is its own");
  // A call still inside the provider after the op's whole timeout has failed the op anyway. One
  // that spins is stuck sooner only once a peer on this host has exited: shm's locks live in the
  // peers' shared memory (and EFA's local traffic goes over shm), and a live peer releases them.
  guard_ = std::make_unique<StuckCallGuard>(kStuckCallCpuLimit, timeout, [watched = liveness_] {
    return watched.first_exited().has_value();
  });
  const fi_info& info = endpoint_->info();
  inject_bytes_ = info.tx_attr->inject_size;
  max_message_bytes_ = std::max<std::size_t>(info.ep_attr->max_msg_size, 1);
  is_shm_ = std::strcmp(info.fabric_attr->prov_name, "shm") == 0;
  // libfabric 1.17's ofi_rxm can crash in fi_close when a peer that failed tore its connection
  // down during a rendezvous: its flush of the connection's completion queue reads a cancelled
  // entry whose context is gone (a segfault in rxm_handle_comp_error, about 1 in 250 failed
  // 3-4 rank collectives over tcp;ofi_rxm on a loaded machine). A failed communicator is never
  // used again, and the process closes its sockets when it exits, so there it stays open.
  const bool rxm = is_rxm(info);
  leaves_failed_endpoint_open_ = rxm;
  // Over TCP the data moves only while the peer runs its progress too: a rank that yields its
  // core to a busy thread (training compute, or any CPU hog) for a time slice stalls both, so it
  // spins longer before yielding. On shm the longer spin only took cycles from the peer under
  // load (bench/results/2026-11-23-fabric-spin-under-load.txt).
  spin_before_yield_ = std::chrono::microseconds(rxm ? 300 : 50);
  // Elsewhere an inject may still sit in a provider queue when fi_tinject returns, and would be
  // lost if this process exited right after its last collective; tracked sends are waited for.
  injects_small_sends_ = is_shm_;
  teardown_ = std::make_unique<Teardown>(
      rank_, size(), Teardown::Provider{is_shm_, rxm, inject_bytes_}, *guard_, liveness_);

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
    s.tag = Agreement::header_tag(peer);
    post_standing_receive(s, s.tag, 0);
  }
}

char* FabricTransport::header_buffer(int peer) const {
  return control_area_.get() + sizeof(CollectiveSignature) * static_cast<std::size_t>(peer);
}

char* FabricTransport::notice_buffer(std::size_t index) const {
  return control_area_.get() + sizeof(CollectiveSignature) * peers_.size() + kNoticeBytes * index;
}

void FabricTransport::post_standing_receive(Slot& s, std::uint64_t tag, std::uint64_t ignore) {
  void* desc = control_registration_->descriptor();
  fid_ep* ep = endpoint_->endpoint();
  const auto deadline = Clock::now() + deadline_.timeout();
  PollBackoff backoff(spin_before_yield_);
  for (;;) {
    const ssize_t rc = guarded("fi_trecv", [&] {
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

void FabricTransport::begin_op(const CollectiveSignature& signature) {
  require_usable();
  if (const auto& pending = teardown_->pending()) fail(pending->source, pending->cause);
  const std::vector<int> parked = agreement_.begin_op(signature);
  deadline_.begin_op();                       // its clock starts at the op's first empty poll
  for (int peer : parked) take_header(peer);  // parks again those still ahead
  if (!agreement_.header_reposts().empty()) repost_header_channels();
}

void FabricTransport::end_op() {
  // Only this op's requests: slots_ keeps as many as the largest op ever needed. A slot released
  // and taken again within the op is listed twice; the second visit finds it free.
  for (Request request : op_requests_) {
    const SlotKind kind = slots_[request].kind;
    if (kind == SlotKind::kSend || kind == SlotKind::kRecv) wait(request);
  }
  op_requests_.clear();
  agreement_.end_op();
  op_registrations_.clear();
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

collectives::PeerTransport::Request FabricTransport::send(int peer, std::uint32_t index,
                                                          const void* data, std::size_t bytes) {
  require_usable();
  const bool large = agreement_.large_message(bytes);
  const bool digest = agreement_.carries_digest(bytes);
  if (agreement_.header_due_before_send(peer, bytes)) send_header(peer);
  const std::uint64_t bits = agreement_.data_tag(rank_, index, bytes);
  fid_ep* ep = endpoint_->endpoint();
  const fi_addr_t destination = peers_[peer];
  const std::uint64_t op_digest = agreement_.digest();
  if (!large && injects_small_sends_) {
    // Written into the peer's shared memory before returning; no completion is generated.
    if (digest) {
      post_with_retry(
          "fi_tinjectdata",
          [&] { return fi_tinjectdata(ep, data, bytes, op_digest, destination, bits); }, peer,
          "a send to");
    } else {
      post_with_retry(
          "fi_tinject", [&] { return fi_tinject(ep, data, bytes, destination, bits); }, peer,
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
        "fi_tsenddata",
        [&] { return fi_tsenddata(ep, data, bytes, desc, op_digest, destination, bits, context); },
        peer, "a send to");
    return request;
  }
  post_with_retry(
      "fi_tsend", [&] { return fi_tsend(ep, data, bytes, desc, destination, bits, context); }, peer,
      "a send to");
  return request;
}

collectives::PeerTransport::Request FabricTransport::recv(int peer, std::uint32_t index, void* data,
                                                          std::size_t bytes) {
  require_usable();
  void* desc = descriptor_for(data, bytes);
  const Request request = acquire(SlotKind::kRecv, peer, index, bytes);
  Slot& s = slots_[request];
  s.buffer = data;
  s.desc = desc;
  s.tag = agreement_.data_tag(peer, index, bytes);
  if (agreement_.receive_ready(peer, request, bytes)) post_receive(request);
  return request;
}

void FabricTransport::wait(Request request) {
  require_usable();
  Slot& s = slots_[request];
  if (!s.done) note_waiting_on(s.peer);
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
    if (now >= header_due && agreement_.probe_due(s.peer)) probe_with_header(s.peer);
    backoff.pause(now);
  }
  release(request);
}

bool FabricTransport::progress() {
  fi_cq_tagged_entry entries[kCompletionBatch];
  fid_cq* cq = endpoint_->completion_queue();
  const ssize_t count =
      guarded("fi_cq_read", [&] { return fi_cq_read(cq, entries, kCompletionBatch); });
  if (count > 0) {
    for (ssize_t i = 0; i < count; ++i) complete(entries[i]);
    if (!agreement_.ready_receives().empty()) post_ready_receives();
    if (!agreement_.header_reposts().empty()) repost_header_channels();
    return true;
  }
  if (!agreement_.ready_receives().empty()) post_ready_receives();
  if (!agreement_.header_reposts().empty()) repost_header_channels();
  if (count == -FI_EAGAIN) return false;
  if (count == -FI_EAVAIL) raise_completion_error();
  fail(-1, "reading the completion queue failed: " + fabric_error_text(count));
}

void FabricTransport::complete(const fi_cq_tagged_entry& entry) {
  Slot& s = *reinterpret_cast<Slot*>(entry.op_context);
  if (s.kind != SlotKind::kControl && s.peer >= 0) teardown_->reached(s.peer);
  switch (s.kind) {
    case SlotKind::kControl:
      take_notice(s, entry);
      s.done = true;  // deferred: the op may still complete
      return;
    case SlotKind::kHeader:
      if (entry.len != sizeof(CollectiveSignature)) fail_mismatch(s.peer, nullptr);
      take_header(s.peer);
      return;  // a standing receive: never "done"
    case SlotKind::kRecv:
      check_received(s, entry);
      break;
    default:
      break;
  }
  s.done = true;
}

void FabricTransport::take_notice(const Slot& s, const fi_cq_tagged_entry& entry) {
  const int source = static_cast<int>(decode_tag(entry.tag).source);
  const Teardown::Notice notice =
      Teardown::read_notice(source, s.buffer, entry.len, agreement_.sequence());
  if (!teardown_->defer(notice, agreement_.sequence(), agreement_.in_op())) {
    fail(source, notice.cause);
  }
  deadline_.limit(Clock::now(), kAbortGrace);
}

void FabricTransport::check_received(const Slot& s, const fi_cq_tagged_entry& entry) {
  if (entry.len != s.bytes) {
    fail(s.peer, "rank " + std::to_string(s.peer) + " sent " + std::to_string(entry.len) +
                     " bytes where this rank expected " + std::to_string(s.bytes) +
                     "; the ranks passed buffers of different sizes");
  }
  if (!agreement_.digest_matches(s.bytes, (entry.flags & FI_REMOTE_CQ_DATA) != 0, entry.data)) {
    fail(s.peer, "rank " + std::to_string(s.peer) + " issued another collective than this " +
                     "rank's " + describe(agreement_.header()) +
                     " (another kind, type, element count, op, root, or DDP_FABRIC_* "
                     "setting); every rank must issue the same collectives in the same "
                     "order");
  }
}

}  // namespace ddp::detail::fabric
