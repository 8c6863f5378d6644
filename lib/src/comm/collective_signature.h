#pragma once
// What a rank believes the current collective is. Backends exchange it with their peers so
// that ranks which disagree (different sizes, types, ops or order) fail with a clear error
// instead of corrupting memory or hanging.
#include <cstdint>
#include <string>

#include "ddp/comm/types.h"

namespace ddp::detail {

enum class CollectiveKind : std::uint32_t {
  kAllreduce = 1,
  kBroadcast,
  kAllgather,
  kReduceScatter,
  kBarrier,
};

struct CollectiveSignature {
  std::uint32_t magic = kMagic;
  CollectiveKind kind = CollectiveKind::kBarrier;
  std::uint32_t dtype = 0;
  std::uint32_t detail = 0;  // the reduce op, or the broadcast root
  std::uint64_t count = 0;   // elements this rank contributes
  std::uint64_t sequence = 0;
  std::uint64_t payload_bytes = 0;  // bytes that follow the header in this message
  // The backend's settings that decide how the collective's messages look (its algorithm
  // choice), as a hash: ranks configured differently must not exchange data.
  std::uint64_t plan = 0;

  static constexpr std::uint32_t kMagic = 0x44445031;  // "DDP1"

  static CollectiveSignature make(CollectiveKind kind, DataType dtype, std::uint64_t count,
                                  std::uint32_t detail, std::uint64_t sequence);

  // Equal in everything that must agree across ranks (not payload_bytes), the plan included.
  bool agrees_with(const CollectiveSignature& other) const;
  // A 64-bit hash of what must agree, less the sequence number: for transports that carry the
  // sequence elsewhere (a message tag) and have only 8 bytes to spare for the rest.
  std::uint64_t digest() const;
};

const char* to_string(CollectiveKind kind);

// "allreduce(sum, float32 x 64, #12)"
std::string describe(const CollectiveSignature& s);

// The one-line cause for a disagreement with `peer`.
std::string mismatch_message(const CollectiveSignature& mine, const CollectiveSignature& theirs,
                             int peer);

}  // namespace ddp::detail
