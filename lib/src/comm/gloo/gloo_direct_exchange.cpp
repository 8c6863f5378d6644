#include "comm/gloo/gloo_direct_exchange.h"

#include <cstring>

#include <gloo/common/error.h>
#include <gloo/context.h>
#include <gloo/transport/unbound_buffer.h>

#include "ddp/error.h"

namespace ddp::detail {
namespace {

static_assert(sizeof(CollectiveSignature) % 8 == 0,
              "payloads follow the signature in a slot: keep them 8-byte aligned");

}  // namespace

std::chrono::milliseconds gloo_wait_budget(std::chrono::steady_clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline - std::chrono::steady_clock::now());
  return std::max(left, std::chrono::milliseconds(1));
}

GlooDirectExchange::GlooDirectExchange(std::shared_ptr<gloo::Context> context,
                                       std::size_t max_payload_bytes, std::uint64_t plan)
    : context_(std::move(context)),
      plan_(plan),
      // Every receive is posted with the full slot size, so a peer that sends more than this
      // rank expects still lands inside the slot and is reported as a mismatch (gloo aborts
      // the process when a message is larger than the posted receive).
      // Slots start on cache lines, so every peer's payload is as aligned as its dtype needs
      // (the budget divided by the peer count is often odd).
      slot_bytes_((sizeof(CollectiveSignature) + max_payload_bytes + 63) / 64 * 64),
      send_storage_(slot_bytes_),
      recv_storage_(2 * slot_bytes_ * static_cast<std::size_t>(std::max(context_->size - 1, 1))) {
  send_buffer_ = context_->createUnboundBuffer(send_storage_.data(), send_storage_.size());
  recv_buffer_ = context_->createUnboundBuffer(recv_storage_.data(), recv_storage_.size());
  // Every rank constructs its exchange at the same point, so the slots agree.
  post_receives(0, next_slot_++);
}

GlooDirectExchange::~GlooDirectExchange() = default;

std::size_t GlooDirectExchange::slot_offset(int half, int peer) const {
  const int peers = std::max(context_->size - 1, 1);
  const int index = peer < context_->rank ? peer : peer - 1;  // no slot for this rank itself
  return slot_bytes_ * static_cast<std::size_t>(half * peers + index);
}

char* GlooDirectExchange::slot_of(int half, int peer) const {
  return const_cast<char*>(recv_storage_.data()) + slot_offset(half, peer);
}

const void* GlooDirectExchange::payload_of(int peer) const {
  // This rank's own payload is read where it was staged for sending: no copy into its slot.
  const char* message = peer == context_->rank ? send_storage_.data() : slot_of(last_half_, peer);
  return message + sizeof(CollectiveSignature);
}

void GlooDirectExchange::post_receives(int half, std::uint64_t slot) {
  for (int peer = 0; peer < context_->size; ++peer) {
    if (peer == context_->rank) continue;
    recv_buffer_->recv(peer, slot, slot_offset(half, peer), slot_bytes_);
  }
  current_half_ = half;
  posted_slot_ = slot;
}

void GlooDirectExchange::run(const CollectiveSignature& mine, const void* payload,
                             std::size_t payload_bytes, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  start(mine, payload, payload_bytes);
  finish(deadline);
}

CollectiveSignature GlooDirectExchange::start(const CollectiveSignature& mine, const void* payload,
                                              std::size_t payload_bytes) {
  if (deferred_error_) std::rethrow_exception(deferred_error_);
  sent_ = mine;
  sent_.sequence = next_sequence_++;
  sent_.plan = plan_;
  sent_.payload_bytes = payload_bytes;
  std::memcpy(send_storage_.data(), &sent_, sizeof(sent_));
  if (payload_bytes > 0) {
    std::memcpy(send_storage_.data() + sizeof(sent_), payload, payload_bytes);
  }
  for (int peer = 0; peer < context_->size; ++peer) {
    if (peer == context_->rank) continue;
    send_buffer_->send(peer, posted_slot_, 0, sizeof(sent_) + payload_bytes);
  }
  return sent_;
}

void GlooDirectExchange::finish(Clock::time_point deadline) {
  const int rank = context_->rank;
  const int size = context_->size;
  const int half = current_half_;
  for (int i = 0; i < size - 1; ++i) recv_buffer_->waitRecv(nullptr, gloo_wait_budget(deadline));
  for (int i = 0; i < size - 1; ++i) send_buffer_->waitSend(nullptr, gloo_wait_budget(deadline));
  last_half_ = half;
  try {
    post_receives(1 - half, next_slot_++);
  } catch (const std::exception&) {
    deferred_error_ = std::current_exception();
  }

  for (int peer = 0; peer < size; ++peer) {
    if (peer == rank) continue;
    CollectiveSignature theirs;
    std::memcpy(&theirs, slot_of(half, peer), sizeof(theirs));
    if (!theirs.agrees_with(sent_)) {
      throw CommError(to_string(sent_.kind), rank, peer, mismatch_message(sent_, theirs, peer));
    }
  }
}

}  // namespace ddp::detail
