#include "comm/fabric/op_signature.h"

namespace ddp::detail::fabric {
namespace {

std::uint64_t fnv1a(std::uint64_t hash, std::uint64_t value) {
  for (int i = 0; i < 8; ++i) {
    hash ^= (value >> (8 * i)) & 0xff;
    hash *= 0x100000001b3ULL;
  }
  return hash;
}

}  // namespace

const char* to_string(OpKind kind) {
  switch (kind) {
    case OpKind::kAllreduce:
      return "allreduce";
    case OpKind::kBroadcast:
      return "broadcast";
    case OpKind::kAllgather:
      return "allgather";
    case OpKind::kReduceScatter:
      return "reduce_scatter";
    case OpKind::kBarrier:
      return "barrier";
  }
  return "unknown";
}

// A hash of everything but the count, plus the count times an odd constant: multiplying by an
// odd number is a bijection modulo 2^32, so two counts that differ by less than 2^32 (the usual
// mistake: an off-by-some buffer) never share a signature.
std::uint32_t op_signature(OpKind kind, std::size_t count, DataType dtype, ReduceOp op, int root,
                           std::uint64_t plan) {
  std::uint64_t hash = 0xcbf29ce484222325ULL;
  hash = fnv1a(hash, static_cast<std::uint64_t>(kind));
  hash = fnv1a(hash, static_cast<std::uint64_t>(dtype));
  hash = fnv1a(hash, static_cast<std::uint64_t>(op));
  hash = fnv1a(hash, static_cast<std::uint64_t>(static_cast<std::int64_t>(root)));
  hash = fnv1a(hash, plan);
  hash ^= hash >> 32;
  return static_cast<std::uint32_t>(hash + static_cast<std::uint64_t>(count) * 0x9E3779B1ULL);
}

}  // namespace ddp::detail::fabric
