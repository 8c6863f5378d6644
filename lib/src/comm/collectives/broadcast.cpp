#include "comm/collectives/broadcast.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "comm/collectives/partition.h"

namespace ddp::detail::collectives {

void broadcast_binomial_tree(PeerTransport& transport, Buffer buffer, int root) {
  const int n = transport.size();
  const int r = transport.rank();
  if (n == 1) return;
  const std::size_t bytes = buffer.bytes();
  char* staging = static_cast<char*>(transport.scratch(bytes));
  // Ranks relative to the root: the root is 0, and rank v receives from v minus its lowest set bit.
  const int v = (r - root + n) % n;
  if (v == 0) std::memcpy(staging, buffer.data, bytes);
  int mask = 1;
  while (mask < n) {
    if (v & mask) {
      transport.wait(transport.recv((v - mask + root) % n, 0, staging, bytes));
      break;
    }
    mask <<= 1;
  }
  std::vector<PeerTransport::Request> sends;
  for (mask >>= 1; mask > 0; mask >>= 1) {
    if (v + mask < n) sends.push_back(transport.send((v + mask + root) % n, 0, staging, bytes));
  }
  for (auto request : sends) transport.wait(request);
  if (v != 0) std::memcpy(buffer.data, staging, bytes);
}

void broadcast_pipelined_chain(PeerTransport& transport, Buffer buffer, int root,
                               const AlgorithmConfig& config) {
  const int n = transport.size();
  const int r = transport.rank();
  if (n == 1) return;
  const std::size_t esize = element_size(buffer.dtype);
  const std::size_t unit =
      std::max(esize, std::min(config.chunk_bytes, transport.max_message_bytes()));
  const std::size_t chunks =
      std::min(std::max<std::size_t>(1, ceil_div(buffer.bytes(), unit)), buffer.count);
  char* base = static_cast<char*>(buffer.data);
  auto span = [&](std::size_t c) {
    const Piece p = partition(buffer.count, chunks, c);
    return std::pair<char*, std::size_t>{base + p.offset * esize, p.count * esize};
  };
  const int position = (r - root + n) % n;
  const int next = (r + 1) % n;
  const int previous = (r - 1 + n) % n;
  const bool forwards = position < n - 1;
  if (position == 0) {
    for (std::size_t c = 0; c < chunks; ++c) {
      auto [data, bytes] = span(c);
      transport.send(next, static_cast<std::uint32_t>(c), data, bytes);
    }
    return;  // end_op waits for the sends
  }
  const std::size_t depth = static_cast<std::size_t>(config.pipeline_depth);
  std::vector<PeerTransport::Request> receives(depth);
  std::size_t posted = 0;
  for (std::size_t c = 0; c < chunks; ++c) {
    for (; posted < chunks && posted < c + depth; ++posted) {
      auto [data, bytes] = span(posted);
      receives[posted % depth] =
          transport.recv(previous, static_cast<std::uint32_t>(posted), data, bytes);
    }
    transport.wait(receives[c % depth]);
    if (forwards) {
      auto [data, bytes] = span(c);
      transport.send(next, static_cast<std::uint32_t>(c), data, bytes);
    }
  }
}

}  // namespace ddp::detail::collectives
