#include "comm/collectives/recursive_doubling.h"

#include <algorithm>
#include <cstring>

#include "comm/collectives/partition.h"

namespace ddp::detail::collectives {
namespace {

constexpr std::uint32_t kFoldIndex = 0;
constexpr std::uint32_t kUnfoldIndex = 1;
constexpr std::uint32_t kFirstExchangeIndex = 2;

// A payload of up to this many eager messages travels as that many: on shm a few 4 KiB injects
// beat one larger message, whose CMA handshake costs a round trip, and sixteen beat the ring's
// two CMA messages at 64 KiB (bench/results/2026-11-25-shm-eager-doubling.txt). 32 covers every
// payload below shm's ring threshold (fabric/provider_tuning.cpp). Message i's pieces use the
// indices i * kMaxPieces + piece.
constexpr std::size_t kMaxPieces = 32;

// How one message of `bytes` is cut: `count` pieces of `piece_bytes` (the last one shorter).
struct Pieces {
  std::size_t count;
  std::size_t piece_bytes;
};

Pieces cut(const PeerTransport& transport, std::size_t bytes) {
  const std::size_t eager = transport.eager_message_bytes();
  if (eager == 0 || bytes <= eager || bytes > kMaxPieces * eager) return {1, bytes};
  return {ceil_div(bytes, eager), eager};
}

std::size_t piece_length(const Pieces& pieces, std::size_t bytes, std::size_t piece) {
  return std::min(pieces.piece_bytes, bytes - piece * pieces.piece_bytes);
}

// Sends and/or receives one message of `bytes` with `peer` (null `out` or `in` skips that
// direction), receives posted first, and waits for all of it.
void exchange(PeerTransport& transport, int peer, std::uint32_t index, const char* out, char* in,
              std::size_t bytes) {
  const Pieces pieces = cut(transport, bytes);
  PeerTransport::Request received[kMaxPieces];
  PeerTransport::Request sent[kMaxPieces];
  const auto piece_index = [&](std::size_t piece) {
    return index * static_cast<std::uint32_t>(kMaxPieces) + static_cast<std::uint32_t>(piece);
  };
  for (std::size_t p = 0; in && p < pieces.count; ++p) {
    received[p] = transport.recv(peer, piece_index(p), in + p * pieces.piece_bytes,
                                 piece_length(pieces, bytes, p));
  }
  for (std::size_t p = 0; out && p < pieces.count; ++p) {
    sent[p] = transport.send(peer, piece_index(p), out + p * pieces.piece_bytes,
                             piece_length(pieces, bytes, p));
  }
  for (std::size_t p = 0; in && p < pieces.count; ++p) transport.wait(received[p]);
  for (std::size_t p = 0; out && p < pieces.count; ++p) transport.wait(sent[p]);
}

}  // namespace

void allreduce_recursive_doubling(PeerTransport& transport, Buffer buffer,
                                  const Reduction& reduction) {
  const int n = transport.size();
  const int r = transport.rank();
  if (n == 1) return;
  const std::size_t bytes = buffer.bytes();
  // The reduction runs in the caller's buffer and receives land in scratch. Eager sends need no
  // registered memory; larger ones are sent from the caller's buffer, registered for this op,
  // which saves copying the payload into scratch and back
  // (bench/results/2026-11-23-fabric-doubling-in-place.txt).
  if (cut(transport, bytes).piece_bytes > transport.eager_message_bytes()) {
    transport.expose(buffer.data, bytes);
  }
  char* work = static_cast<char*>(buffer.data);
  char* incoming = static_cast<char*>(transport.scratch(bytes));

  int power = 1;
  while (power * 2 <= n) power *= 2;
  const int extra = n - power;
  // Among the first 2*extra ranks the even ones hand their data to the next odd one and sit out.
  const bool folded = r < 2 * extra;
  const bool sits_out = folded && r % 2 == 0;
  if (folded) {
    if (sits_out) {
      exchange(transport, r + 1, kFoldIndex, work, nullptr, bytes);
    } else {
      exchange(transport, r - 1, kFoldIndex, nullptr, incoming, bytes);
      reduction.combine(work, work, incoming, buffer.count);
    }
  }
  if (!sits_out) {
    const int virtual_rank = folded ? r / 2 : r - extra;
    std::uint32_t index = kFirstExchangeIndex;
    for (int mask = 1; mask < power; mask <<= 1, ++index) {
      const int virtual_peer = virtual_rank ^ mask;
      const int peer = virtual_peer < extra ? virtual_peer * 2 + 1 : virtual_peer + extra;
      exchange(transport, peer, index, work, incoming, bytes);
      if (mask * 2 < power) {
        reduction.combine(work, work, incoming, buffer.count);
      } else {
        reduction.complete(work, work, incoming, buffer.count);  // the folded ranks get it as is
      }
    }
  }
  if (folded) {
    if (sits_out) {
      // Receives always land in scratch.
      exchange(transport, r + 1, kUnfoldIndex, nullptr, incoming, bytes);
      work = incoming;
    } else {
      exchange(transport, r - 1, kUnfoldIndex, work, nullptr, bytes);
    }
  }
  if (work != buffer.data) std::memcpy(buffer.data, work, bytes);
}

}  // namespace ddp::detail::collectives
