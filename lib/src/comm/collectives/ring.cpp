#include "comm/collectives/ring.h"

#include <algorithm>
#include <vector>

#include "comm/collectives/partition.h"

namespace ddp::detail::collectives {
namespace {

constexpr PeerTransport::Request kNoRequest = ~PeerTransport::Request{0};
// How far ahead of its own position (in segments) a rank posts the first step's sends.
constexpr std::size_t kFirstStepSendsAhead = 8;

int wrap(int value, int n) { return ((value % n) + n) % n; }

}  // namespace

std::vector<Segment> wavefront_order(int steps, std::size_t chunks) {
  std::vector<Segment> order;
  order.reserve(static_cast<std::size_t>(steps) * chunks);
  const std::size_t diagonals = static_cast<std::size_t>(steps) + chunks - 1;
  for (std::size_t d = 0; d < diagonals; ++d) {
    for (int step = 0; step < steps; ++step) {
      const auto s = static_cast<std::size_t>(step);
      if (s <= d && d - s < chunks) order.push_back({step, d - s});
    }
  }
  return order;
}

std::vector<Segment> step_order(int steps, std::size_t chunks) {
  std::vector<Segment> order;
  order.reserve(static_cast<std::size_t>(steps) * chunks);
  for (int step = 0; step < steps; ++step) {
    for (std::size_t c = 0; c < chunks; ++c) order.push_back({step, c});
  }
  return order;
}

std::size_t RingLayout::slot_bytes(const AlgorithmConfig& config) const {
  return static_cast<std::size_t>(config.pipeline_depth) * max_chunk_bytes;
}

RingLayout ring_layout(std::size_t count, DataType dtype, int ranks, const AlgorithmConfig& config,
                       std::size_t max_message_bytes) {
  const std::size_t esize = element_size(dtype);
  const std::size_t block_elems = ceil_div(count, static_cast<std::size_t>(ranks));
  const std::size_t block_bytes = block_elems * esize;
  std::size_t unit = std::min(config.chunk_bytes, max_message_bytes);
  if (config.min_chunk_bytes > 0 && config.min_chunk_bytes < unit) {
    unit =
        std::clamp(block_bytes / AlgorithmConfig::kMinChunksPerBlock, config.min_chunk_bytes, unit);
  }
  std::size_t chunks = std::max<std::size_t>(1, ceil_div(block_bytes, std::max(unit, esize)));
  chunks = std::min(chunks, std::max<std::size_t>(1, block_elems));
  return {chunks, ceil_div(block_elems, chunks) * esize};
}

void run_ring(PeerTransport& transport, Buffer buffer, RingPhases phases,
              const Reduction* reduction, const RingLayout& layout, const AlgorithmConfig& config,
              char* slots) {
  const int n = transport.size();
  const int r = transport.rank();
  if (n == 1) return;
  const std::size_t esize = element_size(buffer.dtype);
  char* base = static_cast<char*>(buffer.data);
  const std::size_t chunks = layout.chunks_per_block;
  const std::size_t depth = static_cast<std::size_t>(config.pipeline_depth);
  const int right = wrap(r + 1, n);
  const int left = wrap(r - 1, n);

  // Steps [0, n-1) reduce-scatter, [n-1, 2n-2) allgather.
  const int first = phases == RingPhases::kAllgather ? n - 1 : 0;
  const int last = phases == RingPhases::kReduceScatter ? n - 1 : 2 * n - 2;
  auto send_block = [&](int step) {
    return step < n - 1 ? wrap(r - step - 1, n) : wrap(r - (step - (n - 1)), n);
  };
  // What arrives at a step is what goes out at the next one.
  auto recv_block = [&](int step) { return send_block(step + 1); };
  struct Span {
    char* data;
    std::size_t bytes;
  };
  auto chunk = [&](int block, std::size_t c) {
    const Piece b = partition(buffer.count, static_cast<std::size_t>(n), block);
    const Piece p = partition(b.count, chunks, c);
    return Span{base + (b.offset + p.offset) * esize, p.count * esize};
  };
  auto message_index = [&](int step, std::size_t c) {
    return static_cast<std::uint32_t>(static_cast<std::size_t>(step) * chunks + c);
  };

  // Sends complete by end_op. An allgather receive lands where a reduce-scatter send of the same
  // chunk left from, and is posted without waiting for that send: what it brings has gone round
  // the ring from the right neighbour, whose receive of that send completed first. Waiting would
  // deadlock on shm, which reports send completions only in posting order.
  auto post_send = [&](int step, std::size_t c) {
    const Span span = chunk(send_block(step), c);
    transport.send(right, message_index(step, c), span.data, span.bytes);
  };

  const std::vector<Segment> order = config.ring_order == RingOrder::kWavefront
                                         ? wavefront_order(last - first, chunks)
                                         : step_order(last - first, chunks);
  const std::size_t segments = order.size();
  std::vector<PeerTransport::Request> receives(depth, kNoRequest);
  auto slot = [&](std::size_t segment) {
    return slots + (segment % depth) * layout.max_chunk_bytes;
  };
  auto post_recv = [&](std::size_t segment) {
    const int step = first + order[segment].step;
    const std::size_t c = order[segment].chunk;
    Span target = chunk(recv_block(step), c);
    if (step < n - 1) target.data = slot(segment);
    receives[segment % depth] =
        transport.recv(left, message_index(step, c), target.data, target.bytes);
  };

  // The first step's sends go out a few segments ahead of this rank's own position, not all at
  // once: a provider's send queue is finite (shm and rxm hold a large send until the receiver
  // takes it), and two ranks whose queues were full of sends the other had not yet reached would
  // never reach them. The neighbour takes chunk c of the first step at the position where this
  // rank posts it plus the lead, so no rank ever waits on a send not yet posted.
  std::size_t scanned = 0;
  auto post_first_step_sends_until = [&](std::size_t end) {
    for (; scanned < std::min(end, segments); ++scanned) {
      if (order[scanned].step == 0) post_send(first, order[scanned].chunk);
    }
  };
  std::size_t posted = 0;
  for (std::size_t segment = 0; segment < segments; ++segment) {
    post_first_step_sends_until(segment + kFirstStepSendsAhead);
    while (posted < segments && posted < segment + depth) post_recv(posted++);
    transport.wait(receives[segment % depth]);
    const int step = first + order[segment].step;
    const std::size_t c = order[segment].chunk;
    if (step < n - 1) {
      const Span own = chunk(recv_block(step), c);
      // The last reduce-scatter step finishes this rank's block.
      if (step == n - 2) {
        reduction->complete(own.data, own.data, slot(segment), own.bytes / esize);
      } else {
        reduction->combine(own.data, own.data, slot(segment), own.bytes / esize);
      }
    }
    if (step + 1 < last) post_send(step + 1, c);
  }
}

}  // namespace ddp::detail::collectives
