#include "comm/collectives/direct.h"

#include <cstring>

namespace ddp::detail::collectives {
namespace {

// out = ((p(0) + p(1)) + p(2)) + ... for the ranks' payloads p (size >= 2); the last
// combination completes the result (for kAvg, divides too). The first step combines ranks 0 and
// 1 straight into `out`: one pass over the data instead of a copy and a pass.
template <typename PayloadOf>
void reduce_in_rank_order(const Reduction& reduction, void* out, std::size_t count, int size,
                          PayloadOf&& payload_of) {
  auto combine = [&](const void* a, int peer) {
    if (peer + 1 < size) {
      reduction.combine(out, a, payload_of(peer), count);
    } else {
      reduction.complete(out, a, payload_of(peer), count);
    }
  };
  combine(payload_of(0), 1);
  for (int peer = 2; peer < size; ++peer) combine(out, peer);
}

}  // namespace

bool takes_direct(const PeerTransport& transport, std::size_t payload_bytes,
                  const AlgorithmConfig& config) {
  const auto peers = static_cast<std::size_t>(transport.size() - 1);
  return payload_bytes <= transport.round_payload_bytes() &&
         payload_bytes * peers < config.direct_bytes;
}

void allreduce_direct(PeerTransport& transport, Buffer buffer, const Reduction& reduction) {
  // The reduction overwrites this rank's payload; ranks 0 and 1 read theirs in its first step,
  // element by element as it writes, so only theirs can be sent from where it lies.
  transport.exchange(buffer.data, buffer.bytes(), PeerTransport::kEveryRank,
                     transport.rank() < 2 ? PeerTransport::PayloadSource::kInPlace
                                          : PeerTransport::PayloadSource::kStage);
  if (buffer.count == 0) return;
  reduce_in_rank_order(reduction, buffer.data, buffer.count, transport.size(),
                       [&](int peer) { return transport.exchanged(peer); });
}

void broadcast_direct(PeerTransport& transport, Buffer buffer, int root) {
  const bool sender = transport.rank() == root;
  // The root does not change its buffer.
  transport.exchange(sender ? buffer.data : nullptr, buffer.bytes(), root,
                     PeerTransport::PayloadSource::kInPlace);
  // An empty buffer may have no storage at all: memcpy must not see its null pointer.
  if (!sender && buffer.count > 0) {
    std::memcpy(buffer.data, transport.exchanged(root), buffer.bytes());
  }
}

void allgather_direct(PeerTransport& transport, Buffer input, Buffer output) {
  // The input may lie inside the output, which the copies below overwrite.
  transport.exchange(input.data, input.bytes(), PeerTransport::kEveryRank,
                     PeerTransport::PayloadSource::kStage);
  if (input.count == 0) return;  // empty buffers may have no storage
  for (int peer = 0; peer < transport.size(); ++peer) {
    std::memcpy(static_cast<char*>(output.data) + input.bytes() * static_cast<std::size_t>(peer),
                transport.exchanged(peer), input.bytes());
  }
}

void reduce_scatter_direct(PeerTransport& transport, Buffer input, Buffer output,
                           const Reduction& reduction) {
  // The output may lie inside the input, which the reduction below overwrites.
  transport.exchange(input.data, input.bytes(), PeerTransport::kEveryRank,
                     PeerTransport::PayloadSource::kStage);
  if (output.count == 0) return;
  const std::size_t offset = output.bytes() * static_cast<std::size_t>(transport.rank());
  reduce_in_rank_order(reduction, output.data, output.count, transport.size(), [&](int peer) {
    return static_cast<const char*>(transport.exchanged(peer)) + offset;
  });
}

void barrier_direct(PeerTransport& transport) {
  transport.exchange(nullptr, 0, PeerTransport::kEveryRank, PeerTransport::PayloadSource::kStage);
}

}  // namespace ddp::detail::collectives
