#include "comm/gloo/gloo_payload_exchange.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

#include <gloo/context.h>
#include <gloo/transport/unbound_buffer.h>

namespace ddp::detail {
namespace {

// What is left of `deadline`, as the timeout of a gloo wait (at least 1 ms).
std::chrono::milliseconds wait_budget(GlooPayloadExchange::Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline - GlooPayloadExchange::Clock::now());
  return std::max(left, std::chrono::milliseconds(1));
}

}  // namespace

GlooPayloadExchange::GlooPayloadExchange(std::shared_ptr<gloo::Context> mesh,
                                         std::size_t max_payload_bytes)
    : mesh_(std::move(mesh)),
      // Slots start on cache lines, so every peer's payload is as aligned as its dtype needs
      // (the budget divided by the peer count is often odd).
      slot_bytes_((max_payload_bytes + 63) / 64 * 64),
      send_storage_(slot_bytes_),
      recv_storage_(2 * slot_bytes_ * static_cast<std::size_t>(std::max(mesh_->size - 1, 1))) {
  send_buffer_ = mesh_->createUnboundBuffer(send_storage_.data(), send_storage_.size());
  recv_buffer_ = mesh_->createUnboundBuffer(recv_storage_.data(), recv_storage_.size());
  // Every rank constructs its exchange at the same point, so the slots agree.
  post_receives(0, next_slot_++);
}

GlooPayloadExchange::~GlooPayloadExchange() = default;

std::size_t GlooPayloadExchange::slot_offset(int half, int peer) const {
  const int peers = std::max(mesh_->size - 1, 1);
  const int index = peer < mesh_->rank ? peer : peer - 1;  // no slot for this rank itself
  return slot_bytes_ * static_cast<std::size_t>(half * peers + index);
}

char* GlooPayloadExchange::slot_of(int half, int peer) const {
  return const_cast<char*>(recv_storage_.data()) + slot_offset(half, peer);
}

const void* GlooPayloadExchange::payload_of(int peer) const {
  // This rank's own payload is read where it was staged for sending: no copy into its slot.
  return peer == mesh_->rank ? send_storage_.data() : slot_of(last_half_, peer);
}

void GlooPayloadExchange::post_receives(int half, std::uint64_t slot) {
  for (int peer = 0; peer < mesh_->size; ++peer) {
    if (peer == mesh_->rank) continue;
    // The full slot size: were a peer to send more, it would still land inside the slot
    // (gloo aborts the process when a message is larger than the posted receive).
    recv_buffer_->recv(peer, slot, slot_offset(half, peer), slot_bytes_);
  }
  posted_half_ = half;
  posted_slot_ = slot;
}

void GlooPayloadExchange::start(const void* payload, std::size_t payload_bytes) {
  if (deferred_error_) std::rethrow_exception(deferred_error_);
  if (payload_bytes > slot_bytes_) {
    throw std::logic_error("GlooPayloadExchange: a payload of " + std::to_string(payload_bytes) +
                           " bytes does not fit its " + std::to_string(slot_bytes_) +
                           "-byte slots");
  }
  if (payload_bytes > 0) std::memcpy(send_storage_.data(), payload, payload_bytes);
  for (int peer = 0; peer < mesh_->size; ++peer) {
    if (peer == mesh_->rank) continue;
    send_buffer_->send(peer, posted_slot_, 0, payload_bytes);
  }
}

void GlooPayloadExchange::finish(Clock::time_point deadline) {
  const int peers = mesh_->size - 1;
  for (int i = 0; i < peers; ++i) recv_buffer_->waitRecv(nullptr, wait_budget(deadline));
  for (int i = 0; i < peers; ++i) send_buffer_->waitSend(nullptr, wait_budget(deadline));
  last_half_ = posted_half_;
  try {
    post_receives(1 - posted_half_, next_slot_++);
  } catch (const std::exception&) {
    deferred_error_ = std::current_exception();
  }
}

void GlooPayloadExchange::abandon() {
  send_buffer_.reset();
  recv_buffer_.reset();
  mesh_.reset();
}

}  // namespace ddp::detail
