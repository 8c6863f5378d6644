#pragma once
// What a rank tells each peer before its first message of a collective: the shared
// CollectiveSignature (what this rank believes the collective is) and a fingerprint of the
// settings that shape its messages. Two ranks that disagree on either must not exchange data.
#include <cstdint>
#include <string>

#include "comm/collective_signature.h"

namespace ddp::detail::collectives {

struct OpHeader {
  CollectiveSignature signature;
  std::uint64_t plan = 0;  // AlgorithmConfig::fingerprint()
};

// Empty when `theirs` (from `peer`) agrees with `mine`, else the one-line cause.
std::string op_header_mismatch(const OpHeader& mine, const OpHeader& theirs, int peer);

}  // namespace ddp::detail::collectives
