#include "comm/fabric/algorithms/recursive_doubling.h"

#include <cstring>

#include "comm/fabric/algorithms/partition.h"

namespace ddp::detail::fabric {
namespace {

constexpr std::uint32_t kFoldIndex = 0;
constexpr std::uint32_t kUnfoldIndex = 1;
constexpr std::uint32_t kFirstExchangeIndex = 2;

}  // namespace

void allreduce_recursive_doubling(PeerTransport& transport, Buffer buffer, ReduceFn reduce) {
  const int n = transport.size();
  const int r = transport.rank();
  if (n == 1) return;
  const std::size_t bytes = buffer.bytes();
  const std::size_t stride = ceil_div(bytes, 64) * 64;
  char* work = static_cast<char*>(transport.scratch(2 * stride));
  char* incoming = work + stride;
  std::memcpy(work, buffer.data, bytes);

  int power = 1;
  while (power * 2 <= n) power *= 2;
  const int extra = n - power;
  // Among the first 2*extra ranks the even ones hand their data to the next odd one and sit out.
  const bool folded = r < 2 * extra;
  const bool sits_out = folded && r % 2 == 0;
  if (folded) {
    if (sits_out) {
      transport.wait(transport.send(r + 1, kFoldIndex, work, bytes));
    } else {
      transport.wait(transport.recv(r - 1, kFoldIndex, incoming, bytes));
      reduce(work, work, incoming, buffer.count);
    }
  }
  if (!sits_out) {
    const int virtual_rank = folded ? r / 2 : r - extra;
    std::uint32_t index = kFirstExchangeIndex;
    for (int mask = 1; mask < power; mask <<= 1, ++index) {
      const int virtual_peer = virtual_rank ^ mask;
      const int peer = virtual_peer < extra ? virtual_peer * 2 + 1 : virtual_peer + extra;
      const auto received = transport.recv(peer, index, incoming, bytes);
      const auto sent = transport.send(peer, index, work, bytes);
      transport.wait(received);
      transport.wait(sent);
      reduce(work, work, incoming, buffer.count);
    }
  }
  if (folded) {
    if (sits_out) {
      transport.wait(transport.recv(r + 1, kUnfoldIndex, work, bytes));
    } else {
      transport.wait(transport.send(r - 1, kUnfoldIndex, work, bytes));
    }
  }
  std::memcpy(buffer.data, work, bytes);
}

}  // namespace ddp::detail::fabric
