#pragma once
// Brackets one collective on a transport: begin_op with this rank's signature, end_op when the
// algorithm is done. Empty payloads still exchange empty messages, so a rank that passed a
// non-empty buffer where the others passed none gets a mismatch error, and all ranks keep the
// same op sequence.
#include <cstdint>

#include "comm/collective_signature.h"
#include "comm/collectives/algorithm_config.h"
#include "comm/collectives/peer_transport.h"
#include "ddp/comm/types.h"

namespace ddp::detail::collectives {

class OpScope {
 public:
  // `stage` tells the steps of a composed collective apart (hierarchical.h): ranks that run
  // different steps on the same transport disagree on the plan and fail at once.
  OpScope(PeerTransport& transport, CollectiveKind kind, const Buffer& b,
          const AlgorithmConfig& config, std::uint32_t detail = 0, std::uint64_t stage = 0)
      : transport_(transport) {
    auto signature = CollectiveSignature::make(kind, b.dtype, b.count, detail, 0);
    signature.plan = config.fingerprint() ^ (stage * 0x9E3779B97F4A7C15ULL);
    transport_.begin_op(signature);
  }
  void finish() { transport_.end_op(); }

 private:
  PeerTransport& transport_;
};

}  // namespace ddp::detail::collectives
