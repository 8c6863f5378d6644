#include "comm/collectives/peer_transport.h"

#include <algorithm>
#include <cstring>
#include <vector>

namespace ddp::detail::collectives {

void PeerTransport::exchange(const void* payload, std::size_t bytes, int sender, PayloadSource) {
  const int n = size();
  const int me = rank();
  // One slot per rank, on cache lines so every payload is as aligned as its dtype needs; this
  // rank's payload is staged in its own slot, where sends may read it.
  round_slot_bytes_ = (bytes + 63) / 64 * 64;
  char* slots = static_cast<char*>(scratch(round_slot_bytes_ * static_cast<std::size_t>(n)));
  round_slots_ = slots;
  const auto sends = [&](int rank) { return sender == kEveryRank || sender == rank; };
  if (sends(me) && bytes > 0) std::memcpy(slots + round_slot_bytes_ * me, payload, bytes);
  std::vector<Request> requests;
  requests.reserve(2 * static_cast<std::size_t>(n));
  for (int peer = 0; peer < n; ++peer) {
    if (peer == me) continue;
    requests.push_back(recv(peer, 0, slots + round_slot_bytes_ * peer, sends(peer) ? bytes : 0));
  }
  for (int peer = 0; peer < n; ++peer) {
    if (peer == me) continue;
    requests.push_back(send(peer, 0, slots + round_slot_bytes_ * me, sends(me) ? bytes : 0));
  }
  for (Request request : requests) wait(request);
}

std::size_t PeerTransport::round_payload_bytes() const {
  constexpr std::size_t kRoundScratchBytes = std::size_t{64} << 20;
  return std::min(max_message_bytes(), kRoundScratchBytes / static_cast<std::size_t>(size()));
}

const void* PeerTransport::exchanged(int peer) const {
  return round_slots_ + round_slot_bytes_ * static_cast<std::size_t>(peer);
}

}  // namespace ddp::detail::collectives
