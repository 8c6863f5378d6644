// The agreement protocol: before data lands where the other side did not mean it to, the ranks
// check that they run the same collective, through a digest in a small message's CQ data or an
// op header on the peer's header channel (see fabric_transport.h).
#include <rdma/fi_tagged.h>

#include <cstring>
#include <type_traits>

#include "comm/fabric/fabric_transport.h"
#include "comm/fabric/fabric_transport_internal.h"
#include "comm/fabric/message_tag.h"

namespace ddp::detail::fabric {

static_assert(std::is_trivially_copyable_v<CollectiveSignature>, "headers travel as raw bytes");

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
    post_with_retry(
        "fi_tinject", [&] { return fi_tinject(ep, &header, sizeof(header), destination, bits); },
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
      "fi_tsend",
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
  guarded("fi_tinject", [&] { return fi_tinject(ep, &header, sizeof(header), destination, bits); });
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
    const ssize_t rc = guarded("fi_trecv", [&] {
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
      "fi_trecv",
      [&] { return fi_trecv(ep, s.buffer, s.bytes, s.desc, FI_ADDR_UNSPEC, s.tag, 0, &s.context); },
      s.peer, "a receive from", true);
}

void FabricTransport::post_ready_receives() {
  post_queued_receives(
      ready_receives_, [this](Request request) -> Slot& { return slots_[request]; },
      "a receive from");
}

void FabricTransport::fail_mismatch(int peer, const CollectiveSignature* theirs) {
  fail(peer, theirs ? mismatch_message(header_, *theirs, peer)
                    : "rank " + std::to_string(peer) +
                          " sent an op header of the wrong size; is it running another version "
                          "of this library?");
}

}  // namespace ddp::detail::fabric
