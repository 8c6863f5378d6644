#include "comm/gloo/gloo_direct_exchange.h"

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
      slots_(mesh_->rank, mesh_->size, sizeof(CollectiveSignature) + kMaxPayloadBytes),
      peers_(static_cast<std::size_t>(mesh_->size)) {
  for (int peer = 0; peer < mesh_->size; ++peer) {
    if (peer == mesh_->rank) continue;
    auto& pair = mesh_->getPair(peer);
    pair->setSync(true, /*busyPoll=*/false);
    for (int half = 0; half < 2; ++half) {
      // A bound buffer's slot names the receiving buffer on the other side: each pair has a
      // receive buffer per half, and sends go to the peer's buffer of the same half.
      peers_[peer].recv[half] =
          pair->createRecvBuffer(half, slots_.receive_slot(half, peer), slots_.slot_bytes());
      peers_[peer].send[half] =
          pair->createSendBuffer(half, slots_.send_slot(), slots_.slot_bytes());
    }
  }
}

GlooDirectExchange::~GlooDirectExchange() = default;

const void* GlooDirectExchange::payload_of(int peer) const {
  // This rank's own payload is read where it was staged for sending: no copy into its slot.
  const char* message = peer == mesh_->rank ? slots_.send_slot() : slots_.receive_slot(half_, peer);
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
  // Folds in the plan of the shared collectives when they run the op (zero otherwise).
  sent_.plan = plan_ * 31 + mine.plan;
  sent_.payload_bytes = payload_bytes;
  half_ = 1 - half_;
  std::memcpy(slots_.send_slot(), &sent_, sizeof(sent_));
  if (payload_bytes > 0) {
    std::memcpy(slots_.send_slot() + sizeof(sent_), payload, payload_bytes);
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
    std::memcpy(&theirs, slots_.receive_slot(half_, peer), sizeof(theirs));
    if (!theirs.agrees_with(sent_)) {
      throw CommError(to_string(sent_.kind), mesh_->rank, peer,
                      mismatch_message(sent_, theirs, peer));
    }
  }
}

}  // namespace ddp::detail
