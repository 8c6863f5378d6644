#include "comm/fabric/agreement.h"

#include <type_traits>

#include "comm/fabric/message_tag.h"

namespace ddp::detail::fabric {

static_assert(std::is_trivially_copyable_v<CollectiveSignature>, "headers travel as raw bytes");

Agreement::Agreement(int size, DigestPolicy policy)
    : policy_(policy), peers_(static_cast<std::size_t>(size)) {}

std::vector<int> Agreement::begin_op(const CollectiveSignature& signature) {
  header_ = signature;
  in_op_ = true;
  ++sequence_;
  header_.sequence = sequence_;
  digest_ = header_.digest();
  std::vector<int> parked;
  parked.swap(parked_headers_);
  return parked;
}

void Agreement::end_op() {
  for (int peer : touched_peers_) peers_[static_cast<std::size_t>(peer)] = PeerOpState{};
  touched_peers_.clear();
  in_op_ = false;
}

Agreement::PeerOpState& Agreement::peer_state(int peer) {
  PeerOpState& state = peers_[static_cast<std::size_t>(peer)];
  if (!state.touched) {
    state.touched = true;
    touched_peers_.push_back(peer);
  }
  return state;
}

bool Agreement::large_message(std::size_t bytes) const {
  // With digests the ranks may disagree on the size before anything shows it: the tags must
  // match regardless, so the size bit stays clear.
  return bytes > policy_.inject_bytes && !policy_.digests_in_cq_data;
}

bool Agreement::carries_digest(std::size_t bytes) const {
  return policy_.digests_in_cq_data || (policy_.small_digests && !large_message(bytes));
}

std::uint64_t Agreement::data_tag(int source, std::uint32_t index, std::size_t bytes) const {
  MessageTag tag;
  tag.large = large_message(bytes);
  tag.sequence = sequence_;
  tag.source = static_cast<std::uint32_t>(source);
  tag.index = data_index(index);
  return encode_tag(tag);
}

std::uint64_t Agreement::header_tag(int source) {
  MessageTag tag;
  tag.source = static_cast<std::uint32_t>(source);
  tag.index = kHeaderIndex;
  return encode_tag(tag);
}

bool Agreement::digest_matches(std::size_t bytes, bool has_data, std::uint64_t data) const {
  return !carries_digest(bytes) || (has_data && data == digest_);
}

bool Agreement::header_due_before_send(int peer, std::size_t bytes) {
  PeerOpState& state = peer_state(peer);
  // The header goes ahead of a message without a digest, and ahead of a small one to a peer this
  // rank receives nothing from (yet), which may expect a large one.
  if (state.header_sent || policy_.digests_in_cq_data) return false;
  if (carries_digest(bytes) && state.receiving) return false;
  state.header_sent = true;
  return true;
}

bool Agreement::probe_due(int peer) {
  if (peers_[static_cast<std::size_t>(peer)].header_sent) return false;
  peer_state(peer).header_sent = true;
  return true;
}

bool Agreement::receive_ready(int peer, Request request, std::size_t bytes) {
  PeerOpState& state = peer_state(peer);
  state.receiving = true;
  // A message without a digest waits for the header: only then is its size known to match the
  // sender's.
  if (carries_digest(bytes) || state.header_valid) return true;
  state.deferred.push_back(request);
  return false;
}

Agreement::Verdict Agreement::take_header(int peer, const CollectiveSignature& theirs) {
  const auto ahead =
      static_cast<std::int32_t>(static_cast<std::uint32_t>(theirs.sequence) - sequence_);
  if (ahead > 0 || (ahead == 0 && !in_op_)) {
    parked_headers_.push_back(peer);  // the channel stays unposted until this rank gets there
    return Verdict::kLater;
  }
  if (ahead < 0) {
    // A header for an op this rank completed came after every message it received from the peer
    // in that op had been checked: nothing is left for it to protect.
    header_reposts_.push_back(peer);
    return Verdict::kEarlier;
  }
  if (!theirs.agrees_with(header_)) return Verdict::kDisagrees;
  PeerOpState& state = peer_state(peer);
  state.header_valid = true;
  ready_receives_.insert(ready_receives_.end(), state.deferred.begin(), state.deferred.end());
  state.deferred.clear();
  header_reposts_.push_back(peer);
  return Verdict::kAgrees;
}

}  // namespace ddp::detail::fabric
