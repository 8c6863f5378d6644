#include "comm/gloo/gloo_peer_transport.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include <gloo/common/error.h>
#include <gloo/context.h>
#include <gloo/transport/unbound_buffer.h>

#include "comm/gloo/gloo_direct_exchange.h"
#include "comm/gloo/gloo_payload_exchange.h"
#include "comm/gloo/gloo_wait_budget.h"
#include "ddp/error.h"

namespace ddp::detail {
namespace {

// Slot layout: bit 63 set (the payload exchange's slots start at 2^62), then 39 bits of the
// op's hash, then 24 bits of message index. Indices beyond 2^24 wrap, which is harmless: gloo
// matches the messages of one slot and peer in posting order.
constexpr std::uint64_t kTransportSlotBit = std::uint64_t{1} << 63;
constexpr int kIndexBits = 24;
constexpr std::uint64_t kIndexMask = (std::uint64_t{1} << kIndexBits) - 1;

std::uint64_t mix(std::uint64_t hash, std::uint64_t value) {
  // splitmix64's finaliser over the running hash.
  hash ^= value + 0x9e3779b97f4a7c15ULL + (hash << 6) + (hash >> 2);
  hash = (hash ^ (hash >> 30)) * 0xbf58476d1ce4e5b9ULL;
  hash = (hash ^ (hash >> 27)) * 0x94d049bb133111ebULL;
  return hash ^ (hash >> 31);
}

std::uint64_t op_hash(const CollectiveSignature& s) {
  std::uint64_t hash = 0;
  for (std::uint64_t value :
       {std::uint64_t{static_cast<std::uint32_t>(s.kind)}, std::uint64_t{s.dtype},
        std::uint64_t{s.detail}, s.count, s.sequence, s.plan}) {
    hash = mix(hash, value);
  }
  return hash;
}

}  // namespace

std::string first_line(const std::string& text) {
  auto nl = text.find('\n');
  return nl == std::string::npos ? text : text.substr(0, nl);
}

collectives::AlgorithmConfig gloo_algorithm_defaults() {
  collectives::AlgorithmConfig config;
  // Up to 1 MiB sent per rank (payload x peers) a collective takes one round rather than the
  // ring's 2(P-1) steps: every message on gloo's asynchronous pairs costs a notification and a
  // wake-up of the waiting thread. Near 1 MiB the two cross over
  // (bench/results/2026-11-23-gloo-allreduce-crossover.txt).
  config.direct_bytes = std::size_t{1} << 20;
  // Past the round, always the ring (and the pipelined chain for broadcasts).
  config.ring_threshold_bytes = 0;
  // The ring's pipeline unit: large enough that a chunk's per-message cost vanishes, small enough
  // to keep both directions busy (4 MiB was the fastest in allreduce_bench --interleave). A block
  // of a few MiB is still cut into up to four chunks of at least 1 MiB, which overlaps its send
  // with its reduction (bench/README.md, "The Gloo backend").
  config.chunk_bytes = std::size_t{4} << 20;
  config.min_chunk_bytes = std::size_t{1} << 20;
  // Two ranks past the round exchange the whole buffer instead (algorithm_config.h).
  config.ring_for_two_ranks = false;
  // A hierarchical allreduce sends the whole buffer across nodes while one message of the
  // exchange mesh carries it (the node's and the cross-node rounds, nothing else).
  config.slice_from_bytes = GlooDirectExchange::kMaxPayloadBytes + 1;
  return config;
}

GlooPeerTransport::GlooPeerTransport(std::shared_ptr<gloo::Context> mesh,
                                     std::shared_ptr<gloo::Context> exchange_mesh,
                                     std::size_t round_bytes, std::chrono::milliseconds timeout)
    : rank_(mesh->rank),
      size_(mesh->size),
      mesh_(std::move(mesh)),
      exchange_mesh_(std::move(exchange_mesh)),
      timeout_(timeout) {
  try {
    // Switches the exchange's pairs to synchronous mode and posts the payload exchange's first
    // receives: a peer that already failed and closed its connection shows here, and must be
    // reported as a communication error like any later one.
    exchange_ = std::make_unique<GlooDirectExchange>(exchange_mesh_, 0);
    if (round_bytes > GlooDirectExchange::kMaxPayloadBytes) {
      payloads_ = std::make_unique<GlooPayloadExchange>(mesh_, round_bytes);
    }
  } catch (const gloo::Exception& e) {
    throw CommError("connect", rank_, -1,
                    first_line(e.what()) +
                        "; a peer exited while the group was forming, see the other ranks' logs");
  }
}

GlooPeerTransport::~GlooPeerTransport() {
  // Pending requests and the pairs go before the memory they may write into.
  fail("closed");
}

template <typename Fn>
auto GlooPeerTransport::guarded(Fn&& fn) -> decltype(fn()) {
  const char* op = to_string(signature_.kind);
  try {
    try {
      return fn();
    } catch (const gloo::IoException& e) {
      const std::string cause = first_line(e.what());
      // "Timed out" from the asynchronous pairs, "Read timeout"/"Write timeout" from the
      // exchange's synchronous ones.
      if (cause.find("Timed out") != std::string::npos ||
          cause.find(" timeout") != std::string::npos) {
        throw TimeoutError(op, rank_, -1,
                           "no progress within the " + std::to_string(timeout_.count()) +
                               " ms timeout (" + cause +
                               "); a peer is stuck, dead, or issued a different collective");
      }
      throw CommError(op, rank_, -1,
                      cause +
                          "; a peer process exited or the network dropped, see the other "
                          "ranks' logs");
    } catch (const gloo::Exception& e) {
      throw CommError(op, rank_, -1, "gloo error: " + first_line(e.what()));
    }
  } catch (const std::exception& e) {
    fail(first_line(e.what()));
    throw;
  }
}

void GlooPeerTransport::fail(const std::string& cause) {
  if (failure_.empty()) failure_ = cause;
  if (!mesh_) return;
  pending_.clear();
  if (payloads_) payloads_->abandon();
  exchange_.reset();
  exchange_mesh_.reset();
  mesh_.reset();
  signatures_checked_ = true;
}

void GlooPeerTransport::begin_op(const CollectiveSignature& signature) {
  signature_ = signature;
  if (!mesh_) {
    throw CommError(to_string(signature.kind), rank_, -1,
                    "the gloo mesh is unusable after an earlier failure (" + failure_ +
                        "); recreate the communicator or restart the job");
  }
  deadline_ = std::chrono::steady_clock::now() + timeout_;
  started_ = false;
}

void GlooPeerTransport::start_op() {
  if (started_) return;
  started_ = true;
  // As sent: with the sequence number.
  const CollectiveSignature sent = exchange_->start(signature_, nullptr, 0);
  op_slots_ = kTransportSlotBit | ((op_hash(sent) << kIndexBits) & ~kTransportSlotBit);
  signatures_checked_ = false;
}

void GlooPeerTransport::check_signatures() {
  if (signatures_checked_) return;
  signatures_checked_ = true;
  exchange_->finish();
}

template <typename Fn>
void GlooPeerTransport::posting(Fn&& fn) {
  try {
    fn();
  } catch (const gloo::IoException&) {
    // A peer that found a mismatch closes its connections, possibly before this rank has
    // looked at the signatures (they have arrived by then): report the mismatch, the cause,
    // rather than the closed connection.
    if (!signatures_checked_) {
      try {
        check_signatures();
      } catch (const CommError&) {
        throw;
      } catch (const std::exception&) {
      }
    }
    throw;
  }
}

void GlooPeerTransport::end_op() {
  guarded([&] {
    start_op();
    check_signatures();
    for (std::size_t i = 0; i < pending_.size(); ++i) {
      if (pending_[i].buffer) wait(static_cast<Request>(i));
    }
    pending_.clear();
  });
}

void* GlooPeerTransport::scratch(std::size_t bytes) {
  if (scratch_.size() < bytes) scratch_.resize(bytes);
  return scratch_.data();
}

std::uint64_t GlooPeerTransport::slot_of(std::uint32_t index) const {
  return op_slots_ | (index & kIndexMask);
}

GlooPeerTransport::Request GlooPeerTransport::send(int peer, std::uint32_t index, const void* data,
                                                   std::size_t bytes) {
  return guarded([&] {
    start_op();
    // gloo only reads from a send buffer; its interface is not const-correct.
    auto buffer = mesh_->createUnboundBuffer(const_cast<void*>(data), bytes);
    posting([&] { buffer->send(peer, slot_of(index), 0, bytes); });
    pending_.push_back({std::move(buffer), true, peer});
    return static_cast<Request>(pending_.size() - 1);
  });
}

GlooPeerTransport::Request GlooPeerTransport::recv(int peer, std::uint32_t index, void* data,
                                                   std::size_t bytes) {
  return guarded([&] {
    start_op();
    auto buffer = mesh_->createUnboundBuffer(data, bytes);
    posting([&] { buffer->recv(peer, slot_of(index), 0, bytes); });
    pending_.push_back({std::move(buffer), false, peer});
    return static_cast<Request>(pending_.size() - 1);
  });
}

void GlooPeerTransport::wait(Request request) {
  guarded([&] {
    // A rank that runs another collective never sends into this op's slots: without this check
    // first, waiting for its data would only end at the timeout.
    check_signatures();
    Pending& p = pending_.at(request);
    note_waiting_on(p.peer);
    if (p.is_send) {
      p.buffer->waitSend(nullptr, gloo_wait_budget(deadline_));
    } else {
      p.buffer->waitRecv(nullptr, gloo_wait_budget(deadline_));
    }
    p.buffer.reset();  // marks the request done
  });
}

std::size_t GlooPeerTransport::round_payload_bytes() const {
  return std::max(GlooDirectExchange::kMaxPayloadBytes,
                  payloads_ ? payloads_->max_payload_bytes() : std::size_t{0});
}

void GlooPeerTransport::exchange(const void* payload, std::size_t bytes, int sender,
                                 PayloadSource source) {
  guarded([&] {
    const bool sends = sender == kEveryRank || sender == rank_;
    const std::size_t mine = sends ? bytes : 0;
    started_ = true;
    // Chosen from what all ranks know alike: the largest payload, `bytes`.
    round_in_exchange_ = bytes <= GlooDirectExchange::kMaxPayloadBytes;
    if (!round_in_exchange_ && (!payloads_ || bytes > payloads_->max_payload_bytes())) {
      throw std::logic_error("GlooPeerTransport: a round of " + std::to_string(bytes) +
                             " bytes exceeds round_payload_bytes()");
    }
    if (round_in_exchange_) {
      // The signature and the payload in one message per peer.
      exchange_->run(signature_, payload, mine);
      return;
    }
    // Signature and payload travel at once; the signatures are checked before any payload is
    // read, so the ranks agree on the payloads' sizes.
    exchange_->start(signature_, nullptr, 0);
    payloads_->start(payload, mine,
                     source == PayloadSource::kInPlace
                         ? GlooPayloadExchange::SendFrom::kCallerMemory
                         : GlooPayloadExchange::SendFrom::kStagedCopy);
    exchange_->finish();
    payloads_->finish(deadline_);
  });
}

const void* GlooPeerTransport::exchanged(int peer) const {
  return round_in_exchange_ ? exchange_->payload_of(peer) : payloads_->payload_of(peer);
}

}  // namespace ddp::detail
