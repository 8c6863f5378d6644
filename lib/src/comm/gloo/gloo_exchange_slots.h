#pragma once
// The memory of an exchange in which every rank sends one message to every other rank: a slot
// this rank's message is staged in, and two halves of receive slots, one per peer (none for
// this rank itself). Exchanges alternate halves, so a peer's next message never lands in one
// still being read. Used by GlooDirectExchange and GlooPayloadExchange.
#include <algorithm>
#include <cstddef>
#include <vector>

namespace ddp::detail {

class GlooExchangeSlots {
 public:
  GlooExchangeSlots(int rank, int size, std::size_t message_bytes)
      : rank_(rank),
        peers_(std::max(size - 1, 1)),
        // Slots start on cache lines, so every peer's payload is as aligned as its dtype
        // needs (a budget divided by the peer count is often odd).
        slot_bytes_((message_bytes + 63) / 64 * 64),
        send_(slot_bytes_),
        receive_(2 * slot_bytes_ * static_cast<std::size_t>(peers_)) {}

  std::size_t slot_bytes() const { return slot_bytes_; }
  char* send_slot() { return send_.data(); }
  const char* send_slot() const { return send_.data(); }

  // Where `peer`'s slot of `half` starts in the receive storage.
  std::size_t offset(int half, int peer) const {
    const int index = peer < rank_ ? peer : peer - 1;
    return slot_bytes_ * static_cast<std::size_t>(half * peers_ + index);
  }
  char* receive_slot(int half, int peer) { return receive_.data() + offset(half, peer); }
  const char* receive_slot(int half, int peer) const {
    return receive_.data() + offset(half, peer);
  }
  std::vector<char>& receive_storage() { return receive_; }

 private:
  int rank_;
  int peers_;
  std::size_t slot_bytes_;
  std::vector<char> send_;
  std::vector<char> receive_;
};

}  // namespace ddp::detail
