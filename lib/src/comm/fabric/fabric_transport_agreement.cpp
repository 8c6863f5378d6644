// Carrying out the agreement protocol's decisions (agreement.h): header sends, the standing
// header channels, and the receives that waited for a header.
#include <rdma/fi_tagged.h>

#include <cstring>

#include "comm/fabric/fabric_transport.h"
#include "comm/fabric/fabric_transport_internal.h"
#include "comm/fabric/message_tag.h"

namespace ddp::detail::fabric {

void FabricTransport::send_header(int peer) {
  const std::uint64_t bits = Agreement::header_tag(rank_);
  const CollectiveSignature& header = agreement_.header();
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
  if (liveness_.exiting(peer)) return;
  const CollectiveSignature& header = agreement_.header();
  const std::uint64_t bits = Agreement::header_tag(rank_);
  fid_ep* ep = endpoint_->endpoint();
  const fi_addr_t destination = peers_[peer];
  guarded("fi_tinject", [&] { return fi_tinject(ep, &header, sizeof(header), destination, bits); });
}

void FabricTransport::take_header(int peer) {
  CollectiveSignature theirs;
  std::memcpy(&theirs, header_buffer(peer), sizeof(theirs));
  if (agreement_.take_header(peer, theirs) == Agreement::Verdict::kDisagrees) {
    fail_mismatch(peer, &theirs);
  }
}

void FabricTransport::repost_header_channels() {
  post_queued_receives(
      agreement_.header_reposts(), [this](int peer) -> Slot& { return *header_slots_[peer]; },
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
      agreement_.ready_receives(), [this](Request request) -> Slot& { return slots_[request]; },
      "a receive from");
}

void FabricTransport::fail_mismatch(int peer, const CollectiveSignature* theirs) {
  fail(peer, theirs ? mismatch_message(agreement_.header(), *theirs, peer)
                    : "rank " + std::to_string(peer) +
                          " sent an op header of the wrong size; is it running another version "
                          "of this library?");
}

}  // namespace ddp::detail::fabric
