#include "comm/collective_signature.h"

namespace ddp::detail {

CollectiveSignature CollectiveSignature::make(CollectiveKind kind, DataType dtype,
                                              std::uint64_t count, std::uint32_t detail,
                                              std::uint64_t sequence) {
  CollectiveSignature s;
  s.kind = kind;
  s.dtype = static_cast<std::uint32_t>(dtype);
  s.count = count;
  s.detail = detail;
  s.sequence = sequence;
  return s;
}

bool CollectiveSignature::agrees_with(const CollectiveSignature& o) const {
  return magic == o.magic && kind == o.kind && dtype == o.dtype && detail == o.detail &&
         count == o.count && sequence == o.sequence && plan == o.plan;
}

std::uint64_t CollectiveSignature::digest() const {
  std::uint64_t hash = 0xcbf29ce484222325ULL;  // FNV-1a over the fields that must agree
  for (std::uint64_t field : {std::uint64_t{magic}, static_cast<std::uint64_t>(kind),
                              std::uint64_t{dtype}, std::uint64_t{detail}, count, plan}) {
    for (int byte = 0; byte < 8; ++byte) {
      hash = (hash ^ ((field >> (8 * byte)) & 0xff)) * 0x100000001b3ULL;
    }
  }
  return hash;
}

const char* to_string(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::kAllreduce:
      return "allreduce";
    case CollectiveKind::kBroadcast:
      return "broadcast";
    case CollectiveKind::kAllgather:
      return "allgather";
    case CollectiveKind::kReduceScatter:
      return "reduce_scatter";
    case CollectiveKind::kBarrier:
      return "barrier";
  }
  return "unknown collective";
}

std::string describe(const CollectiveSignature& s) {
  if (s.magic != CollectiveSignature::kMagic) return "a message that is not a ddp collective";
  std::string text = std::string(to_string(s.kind)) + "(";
  if (s.kind == CollectiveKind::kAllreduce || s.kind == CollectiveKind::kReduceScatter) {
    text += std::string(to_string(static_cast<ReduceOp>(s.detail))) + ", ";
  } else if (s.kind == CollectiveKind::kBroadcast) {
    text += "root " + std::to_string(s.detail) + ", ";
  }
  if (s.kind != CollectiveKind::kBarrier) {
    text += std::string(to_string(static_cast<DataType>(s.dtype))) + " x " +
            std::to_string(s.count) + ", ";
  }
  return text + "#" + std::to_string(s.sequence) + ")";
}

std::string mismatch_message(const CollectiveSignature& mine, const CollectiveSignature& theirs,
                             int peer) {
  const bool only_the_plan_differs = theirs.plan != mine.plan && [&] {
    CollectiveSignature same_plan = theirs;
    same_plan.plan = mine.plan;
    return same_plan.agrees_with(mine);
  }();
  if (only_the_plan_differs) {
    return "rank " + std::to_string(peer) + " runs " + describe(mine) +
           " with other algorithm settings (DDP_ALGORITHM, DDP_DIRECT_BYTES, DDP_RING_*, "
           "DDP_CHUNK_BYTES, DDP_HIERARCHY_SLICE_BYTES); set them alike on every rank";
  }
  return "rank " + std::to_string(peer) + " issued " + describe(theirs) +
         " while this rank issued " + describe(mine) +
         "; every rank must issue the same collectives, in the same order, with the same sizes";
}

}  // namespace ddp::detail
