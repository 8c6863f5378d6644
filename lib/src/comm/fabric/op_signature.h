#pragma once
// A short hash of a collective's arguments that every rank computes from its own call. Messages
// carry it in the op header; a receiver that sees a different value knows the sender issued
// another collective or passed a buffer of another size or type, and fails with a clear error.
#include <cstddef>
#include <cstdint>

#include "ddp/comm/types.h"

namespace ddp::detail::fabric {

enum class OpKind : std::uint8_t { kAllreduce, kBroadcast, kAllgather, kReduceScatter, kBarrier };

const char* to_string(OpKind kind);

// `count` is the element count that must agree on every rank (allgather: the input count;
// reduce_scatter: the output count). `plan` fingerprints the settings that shape the messages
// (chunk size, algorithm thresholds), which must agree as well.
std::uint32_t op_signature(OpKind kind, std::size_t count, DataType dtype, ReduceOp op, int root,
                           std::uint64_t plan = 0);

}  // namespace ddp::detail::fabric
