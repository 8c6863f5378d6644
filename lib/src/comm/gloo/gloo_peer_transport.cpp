#include "comm/gloo/gloo_peer_transport.h"

#include <gloo/common/error.h>
#include <gloo/context.h>
#include <gloo/transport/unbound_buffer.h>

#include "comm/gloo/gloo_direct_exchange.h"
#include "comm/gloo/gloo_wait_budget.h"
#include "ddp/error.h"

namespace ddp::detail {
namespace {

// Slot layout: bit 63 set (gloo's own collectives and the direct exchange use small slots),
// then 39 bits of the op's hash, then 24 bits of message index. Indices beyond 2^24 wrap, which
// is harmless: gloo matches the messages of one slot and peer in posting order.
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

GlooPeerTransport::GlooPeerTransport(std::shared_ptr<gloo::Context> context,
                                     GlooDirectExchange& exchange,
                                     std::chrono::milliseconds timeout)
    : context_(std::move(context)), exchange_(exchange), timeout_(timeout) {}

GlooPeerTransport::~GlooPeerTransport() = default;

int GlooPeerTransport::rank() const { return context_->rank; }
int GlooPeerTransport::size() const { return context_->size; }

void GlooPeerTransport::begin_op(const CollectiveSignature& signature) {
  deadline_ = std::chrono::steady_clock::now() + timeout_;
  // As sent: with the sequence number, and the backend's plan folded into the collectives' one.
  const CollectiveSignature sent = exchange_.start(signature, nullptr, 0);
  op_slots_ = kTransportSlotBit | ((op_hash(sent) << kIndexBits) & ~kTransportSlotBit);
  signatures_checked_ = false;
}

void GlooPeerTransport::check_signatures() {
  if (signatures_checked_) return;
  signatures_checked_ = true;
  exchange_.finish();
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
  check_signatures();
  for (std::size_t i = 0; i < pending_.size(); ++i) {
    if (pending_[i].buffer) wait(static_cast<Request>(i));
  }
  pending_.clear();
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
  // gloo only reads from a send buffer; its interface is not const-correct.
  auto buffer = context_->createUnboundBuffer(const_cast<void*>(data), bytes);
  posting([&] { buffer->send(peer, slot_of(index), 0, bytes); });
  pending_.push_back({std::move(buffer), true});
  return static_cast<Request>(pending_.size() - 1);
}

GlooPeerTransport::Request GlooPeerTransport::recv(int peer, std::uint32_t index, void* data,
                                                   std::size_t bytes) {
  auto buffer = context_->createUnboundBuffer(data, bytes);
  posting([&] { buffer->recv(peer, slot_of(index), 0, bytes); });
  pending_.push_back({std::move(buffer), false});
  return static_cast<Request>(pending_.size() - 1);
}

void GlooPeerTransport::wait(Request request) {
  // A rank that runs another collective never sends into this op's slots: without this check
  // first, waiting for its data would only end at the timeout.
  check_signatures();
  Pending& p = pending_.at(request);
  if (p.is_send) {
    p.buffer->waitSend(nullptr, gloo_wait_budget(deadline_));
  } else {
    p.buffer->waitRecv(nullptr, gloo_wait_budget(deadline_));
  }
  p.buffer.reset();  // marks the request done
}

void GlooPeerTransport::abandon() {
  pending_.clear();
  context_.reset();
  signatures_checked_ = true;
}

}  // namespace ddp::detail
