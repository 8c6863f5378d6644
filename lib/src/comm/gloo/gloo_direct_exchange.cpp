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

std::size_t GlooDirectExchange::pieces_in(std::size_t payload_bytes) {
  return std::max<std::size_t>(1, (payload_bytes + kPieceBytes - 1) / kPieceBytes);
}

GlooDirectExchange::GlooDirectExchange(std::shared_ptr<gloo::Context> mesh,
                                       std::size_t max_payload_bytes, std::uint64_t plan)
    : mesh_(std::move(mesh)),
      plan_(plan),
      // Slots start on cache lines, so every peer's payload is as aligned as its dtype needs
      // (the budget divided by the peer count is often odd).
      slot_bytes_((sizeof(CollectiveSignature) + max_payload_bytes + 63) / 64 * 64),
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

void GlooDirectExchange::send_piece(std::size_t piece) {
  // Piece 0 carries the signature too.
  const std::size_t begin = piece == 0 ? 0 : sizeof(sent_) + piece * kPieceBytes;
  const std::size_t end =
      sizeof(sent_) + std::min<std::size_t>(sent_.payload_bytes, (piece + 1) * kPieceBytes);
  for (int peer = 0; peer < mesh_->size; ++peer) {
    if (peer == mesh_->rank) continue;
    auto& buffer = *peers_[peer].send[half_];
    buffer.send(begin, end - begin, begin);
    buffer.waitSend();  // the write is done; this only settles gloo's count
  }
}

CollectiveSignature GlooDirectExchange::start(const CollectiveSignature& mine, const void* payload,
                                              std::size_t payload_bytes) {
  if (sizeof(sent_) + payload_bytes > slot_bytes_) {
    throw std::logic_error("GlooDirectExchange: a payload of " + std::to_string(payload_bytes) +
                           " bytes does not fit its " + std::to_string(slot_bytes_) +
                           "-byte slots");
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
  send_piece(0);
  return sent_;
}

void GlooDirectExchange::finish() {
  const int size = mesh_->size;
  const int rank = mesh_->rank;
  for (int peer = 0; peer < size; ++peer) {
    if (peer != rank) peers_[peer].recv[half_]->waitRecv();
  }
  // Before any further piece: ranks that disagree may not even agree on how many there are.
  const std::size_t pieces = pieces_in(sent_.payload_bytes);
  for (int peer = 0; peer < size; ++peer) {
    if (peer == rank) continue;
    CollectiveSignature theirs;
    std::memcpy(&theirs, slot_of(half_, peer), sizeof(theirs));
    if (!theirs.agrees_with(sent_)) {
      throw CommError(to_string(sent_.kind), rank, peer, mismatch_message(sent_, theirs, peer));
    }
    if (pieces_in(theirs.payload_bytes) != pieces) {
      throw std::logic_error("GlooDirectExchange: ranks send payloads of different piece counts");
    }
  }
  for (std::size_t piece = 1; piece < pieces; ++piece) {
    send_piece(piece);
    for (int peer = 0; peer < size; ++peer) {
      if (peer != rank) peers_[peer].recv[half_]->waitRecv();
    }
  }
}

}  // namespace ddp::detail
