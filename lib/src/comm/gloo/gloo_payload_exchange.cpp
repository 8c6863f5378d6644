#include "comm/gloo/gloo_payload_exchange.h"

#include <cstring>
#include <stdexcept>
#include <string>

#include <gloo/context.h>
#include <gloo/transport/unbound_buffer.h>

#include "comm/gloo/gloo_wait_budget.h"

namespace ddp::detail {
GlooPayloadExchange::GlooPayloadExchange(std::shared_ptr<gloo::Context> mesh,
                                         std::size_t max_payload_bytes)
    : mesh_(std::move(mesh)),
      max_payload_bytes_(max_payload_bytes),
      slots_(mesh_->rank, mesh_->size, max_payload_bytes) {
  send_buffer_ = mesh_->createUnboundBuffer(slots_.send_slot(), slots_.slot_bytes());
  auto& receive = slots_.receive_storage();
  recv_buffer_ = mesh_->createUnboundBuffer(receive.data(), receive.size());
  // Every rank constructs its exchange at the same point, so the slots agree.
  post_receives(0, next_slot_++);
}

GlooPayloadExchange::~GlooPayloadExchange() = default;

const void* GlooPayloadExchange::payload_of(int peer) const {
  // This rank's own payload is read where it was sent from: no copy into its slot.
  return peer == mesh_->rank ? own_payload_ : slots_.receive_slot(last_half_, peer);
}

void GlooPayloadExchange::post_receives(int half, std::uint64_t slot) {
  for (int peer = 0; peer < mesh_->size; ++peer) {
    if (peer == mesh_->rank) continue;
    // The full slot size: were a peer to send more, it would still land inside the slot
    // (gloo aborts the process when a message is larger than the posted receive).
    recv_buffer_->recv(peer, slot, slots_.offset(half, peer), slots_.slot_bytes());
  }
  posted_half_ = half;
  posted_slot_ = slot;
}

void GlooPayloadExchange::start(const void* payload, std::size_t payload_bytes, SendFrom from) {
  if (deferred_error_) std::rethrow_exception(deferred_error_);
  if (payload_bytes > slots_.slot_bytes()) {
    throw std::logic_error("GlooPayloadExchange: a payload of " + std::to_string(payload_bytes) +
                           " bytes does not fit its " + std::to_string(slots_.slot_bytes()) +
                           "-byte slots");
  }
  gloo::transport::UnboundBuffer* sender = send_buffer_.get();
  own_payload_ = slots_.send_slot();
  if (from == SendFrom::kCallerMemory && payload_bytes > 0) {
    // Saves a copy of the whole payload. gloo only reads from a send buffer; its interface is
    // not const-correct.
    caller_buffer_ = mesh_->createUnboundBuffer(const_cast<void*>(payload), payload_bytes);
    sender = caller_buffer_.get();
    own_payload_ = payload;
  } else if (payload_bytes > 0) {
    std::memcpy(slots_.send_slot(), payload, payload_bytes);
  }
  for (int peer = 0; peer < mesh_->size; ++peer) {
    if (peer == mesh_->rank) continue;
    sender->send(peer, posted_slot_, 0, payload_bytes);
  }
}

void GlooPayloadExchange::finish(Clock::time_point deadline) {
  const int peers = mesh_->size - 1;
  for (int i = 0; i < peers; ++i) recv_buffer_->waitRecv(nullptr, gloo_wait_budget(deadline));
  gloo::transport::UnboundBuffer* sender =
      caller_buffer_ ? caller_buffer_.get() : send_buffer_.get();
  for (int i = 0; i < peers; ++i) sender->waitSend(nullptr, gloo_wait_budget(deadline));
  // gloo is done reading the caller's payload: let go of it.
  caller_buffer_.reset();
  last_half_ = posted_half_;
  try {
    post_receives(1 - posted_half_, next_slot_++);
  } catch (const std::exception&) {
    deferred_error_ = std::current_exception();
  }
}

void GlooPayloadExchange::abandon() {
  caller_buffer_.reset();
  send_buffer_.reset();
  recv_buffer_.reset();
  mesh_.reset();
}

}  // namespace ddp::detail
