#include "comm/gloo/gloo_direct_exchange.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

#include <gloo/context.h>
#include <gloo/transport/buffer.h>
#include <gloo/transport/pair.h>

#include "ddp/error.h"

namespace ddp::detail {
namespace {

static_assert(sizeof(CollectiveSignature) % 8 == 0,
              "payloads follow the signature in a slot: keep them 8-byte aligned");

}  // namespace

GlooDirectExchange::GlooDirectExchange(std::shared_ptr<gloo::Context> mesh, std::uint64_t plan)
    : mesh_(std::move(mesh)),
      plan_(plan),
      // Slots start on cache lines, so every peer's payload is as aligned as its dtype needs.
      slot_bytes_((sizeof(CollectiveSignature) + kMaxPayloadBytes + 63) / 64 * 64),
      send_storage_(slot_bytes_),
      recv_storage_(2 * slot_bytes_ * static_cast<std::size_t>(std::max(mesh_->size - 1, 1))),
      peers_(static_cast<std::size_t>(mesh_->size)) {
  for (int peer = 0; peer < mesh_->size; ++peer) {
    if (peer == mesh_->rank) continue;
    auto& pair = mesh_->getPair(peer);
    pair->setSync(true, /*busyPoll=*/false);
    for (int half = 0; half < 2; ++half) {
      // A bound buffer's slot names the receiving buffer on the other side: each pair has a
      // receive buffer per half, and sends go to the peer's buffer of the same half.
      peers_[peer].recv[half] = pair->createRecvBuffer(half, slot_of(half, peer), slot_bytes_);
      peers_[peer].send[half] = pair->createSendBuffer(half, send_storage_.data(), slot_bytes_);
    }
  }
}

GlooDirectExchange::~GlooDirectExchange() = default;

std::size_t GlooDirectExchange::slot_offset(int half, int peer) const {
  const int peers = std::max(mesh_->size - 1, 1);
  const int index = peer < mesh_->rank ? peer : peer - 1;  // no slot for this rank itself
  return slot_bytes_ * static_cast<std::size_t>(half * peers + index);
}

char* GlooDirectExchange::slot_of(int half, int peer) const {
  return const_cast<char*>(recv_storage_.data()) + slot_offset(half, peer);
}

const void* GlooDirectExchange::payload_of(int peer) const {
  // This rank's own payload is read where it was staged for sending: no copy into its slot.
  const char* message = peer == mesh_->rank ? send_storage_.data() : slot_of(half_, peer);
  return message + sizeof(CollectiveSignature);
}

void GlooDirectExchange::run(const CollectiveSignature& mine, const void* payload,
                             std::size_t payload_bytes) {
  start(mine, payload, payload_bytes);
  finish();
}

CollectiveSignature GlooDirectExchange::start(const CollectiveSignature& mine, const void* payload,
                                              std::size_t payload_bytes) {
  if (payload_bytes > kMaxPayloadBytes) {
    throw std::logic_error("GlooDirectExchange: a payload of " + std::to_string(payload_bytes) +
                           " bytes exceeds its " + std::to_string(kMaxPayloadBytes));
  }
  sent_ = mine;
  sent_.sequence = next_sequence_++;
  sent_.plan = plan_;
  sent_.payload_bytes = payload_bytes;
  half_ = 1 - half_;
  std::memcpy(send_storage_.data(), &sent_, sizeof(sent_));
  if (payload_bytes > 0) {
    std::memcpy(send_storage_.data() + sizeof(sent_), payload, payload_bytes);
  }
  const std::size_t message_bytes = sizeof(sent_) + payload_bytes;
  for (int peer = 0; peer < mesh_->size; ++peer) {
    if (peer == mesh_->rank) continue;
    auto& buffer = *peers_[peer].send[half_];
    buffer.send(0, message_bytes);
    buffer.waitSend();  // the write is done; this only settles gloo's count
  }
  return sent_;
}

void GlooDirectExchange::finish() {
  for (int peer = 0; peer < mesh_->size; ++peer) {
    if (peer != mesh_->rank) peers_[peer].recv[half_]->waitRecv();
  }
  for (int peer = 0; peer < mesh_->size; ++peer) {
    if (peer == mesh_->rank) continue;
    CollectiveSignature theirs;
    std::memcpy(&theirs, slot_of(half_, peer), sizeof(theirs));
    if (!theirs.agrees_with(sent_)) {
      throw CommError(to_string(sent_.kind), mesh_->rank, peer,
                      mismatch_message(sent_, theirs, peer));
    }
  }
}

}  // namespace ddp::detail
