#pragma once
// The 64-bit tag every fabric message carries. Receives match tags exactly (no ignore bits):
// libfabric 1.17's shm provider matches early ("unexpected") messages with a stale ignore mask
// and can miss them.
//
//   bit 63      control: 1 for an abort notice, 0 for collective traffic
//   bit 62      large: the payload exceeds the provider's inject size
//   bits 40-61  sequence number of the collective on this communicator (mod 2^22)
//   bits 20-39  source rank (the tag names the sender, so no FI_DIRECTED_RECV is needed)
//   bits 0-19   message index within the collective; kHeaderIndex (with sequence 0) is the
//               sender's header channel, whose headers carry their sequence inside
//
// The large bit keeps a large message from ever matching a receive posted for a small one: on
// shm a large message lands by CMA, and a CMA message longer than its receive makes the provider
// spin forever instead of reporting FI_ETRUNC. Large receives are only posted once the sender's
// op header has shown that both ranks run the same collective (see fabric_transport.h). Over
// ofi_rxm, which reports truncation, the bit stays clear and receives are posted at once.
#include <cstdint>

namespace ddp::detail::fabric {

struct MessageTag {
  bool control = false;
  bool large = false;
  std::uint32_t sequence = 0;
  std::uint32_t source = 0;
  std::uint32_t index = 0;
};

inline constexpr int kIndexBits = 20;
inline constexpr int kSourceBits = 20;
inline constexpr int kSequenceBits = 22;
inline constexpr int kMaxRanks = 1 << kSourceBits;
// The op header's index; data messages use indices below it (see data_index).
inline constexpr std::uint32_t kHeaderIndex = (1u << kIndexBits) - 1;

inline constexpr int kSourceShift = kIndexBits;
inline constexpr int kSequenceShift = kSourceShift + kSourceBits;
inline constexpr int kLargeShift = kSequenceShift + kSequenceBits;
inline constexpr int kControlShift = kLargeShift + 1;
static_assert(kControlShift == 63, "the tag fields must fill exactly 64 bits");

// An abort receive ignores everything but the control bit, so it takes any sender. It is posted
// before any peer can send, so it never depends on unexpected-message matching.
inline constexpr std::uint64_t kControlIgnoreBits = ~(std::uint64_t{1} << kControlShift);

// Message indices wrap below kHeaderIndex, so data never collides with the header.
constexpr std::uint32_t data_index(std::uint32_t index) { return index % kHeaderIndex; }

constexpr std::uint64_t tag_field(std::uint32_t value, int bits, int shift) {
  return (std::uint64_t{value} & ((std::uint64_t{1} << bits) - 1)) << shift;
}

constexpr std::uint64_t encode_tag(const MessageTag& tag) {
  return (std::uint64_t{tag.control} << kControlShift) | (std::uint64_t{tag.large} << kLargeShift) |
         tag_field(tag.sequence, kSequenceBits, kSequenceShift) |
         tag_field(tag.source, kSourceBits, kSourceShift) | tag_field(tag.index, kIndexBits, 0);
}

constexpr MessageTag decode_tag(std::uint64_t bits) {
  auto take = [bits](int width, int shift) {
    return static_cast<std::uint32_t>((bits >> shift) & ((std::uint64_t{1} << width) - 1));
  };
  MessageTag tag;
  tag.control = (bits >> kControlShift) & 1;
  tag.large = (bits >> kLargeShift) & 1;
  tag.sequence = take(kSequenceBits, kSequenceShift);
  tag.source = take(kSourceBits, kSourceShift);
  tag.index = take(kIndexBits, 0);
  return tag;
}

}  // namespace ddp::detail::fabric
