#include "comm/collectives/barrier.h"

namespace ddp::detail::collectives {

void barrier_dissemination(PeerTransport& transport) {
  const int n = transport.size();
  const int r = transport.rank();
  std::uint32_t round = 0;
  for (int distance = 1; distance < n; distance <<= 1, ++round) {
    const auto received = transport.recv((r - distance + n) % n, round, nullptr, 0);
    const auto sent = transport.send((r + distance) % n, round, nullptr, 0);
    transport.wait(received);
    transport.wait(sent);
  }
}

}  // namespace ddp::detail::collectives
