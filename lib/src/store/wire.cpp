#include "store/wire.h"

#include <array>

namespace ddp::store {
namespace {

// Index: query byte; value: the op it means.
constexpr std::array<Op, 13> kLegacy = {
    Op::kSet,     Op::kCompareSet, Op::kGet,      Op::kAdd,      Op::kCheck,
    Op::kWait,    Op::kNumKeys,    Op::kWatchKey, Op::kDeleteKey, Op::kAppend,
    Op::kMultiGet, Op::kMultiSet,  Op::kCancelWait};
constexpr std::array<Op, 17> kModern = {
    Op::kValidate,  Op::kSet,        Op::kCompareSet, Op::kGet,      Op::kAdd,
    Op::kCheck,     Op::kWait,       Op::kNumKeys,    Op::kDeleteKey, Op::kAppend,
    Op::kMultiGet,  Op::kMultiSet,   Op::kCancelWait, Op::kPing,     Op::kQueuePush,
    Op::kQueuePop,  Op::kQueueLen};

template <std::size_t N>
std::optional<uint8_t> index_of(const std::array<Op, N>& table, Op op) {
  for (std::size_t i = 0; i < N; ++i) {
    if (table[i] == op) return static_cast<uint8_t>(i);
  }
  return std::nullopt;
}

}  // namespace

std::optional<Op> decode_op(Dialect dialect, uint8_t byte) {
  if (dialect == Dialect::kLegacy) {
    if (byte < kLegacy.size()) return kLegacy[byte];
  } else if (byte < kModern.size()) {
    return kModern[byte];
  }
  return std::nullopt;
}

std::optional<uint8_t> encode_op(Dialect dialect, Op op) {
  return dialect == Dialect::kLegacy ? index_of(kLegacy, op) : index_of(kModern, op);
}

const char* op_name(Op op) {
  switch (op) {
    case Op::kValidate: return "VALIDATE";
    case Op::kSet: return "SET";
    case Op::kCompareSet: return "COMPARE_SET";
    case Op::kGet: return "GET";
    case Op::kAdd: return "ADD";
    case Op::kCheck: return "CHECK";
    case Op::kWait: return "WAIT";
    case Op::kNumKeys: return "GETNUMKEYS";
    case Op::kWatchKey: return "WATCH_KEY";
    case Op::kDeleteKey: return "DELETE_KEY";
    case Op::kAppend: return "APPEND";
    case Op::kMultiGet: return "MULTI_GET";
    case Op::kMultiSet: return "MULTI_SET";
    case Op::kCancelWait: return "CANCEL_WAIT";
    case Op::kPing: return "PING";
    case Op::kQueuePush: return "QUEUE_PUSH";
    case Op::kQueuePop: return "QUEUE_POP";
    case Op::kQueueLen: return "QUEUE_LEN";
  }
  return "?";
}

const char* dialect_name(Dialect dialect) {
  return dialect == Dialect::kLegacy ? "1.13/2.0 (legacy)" : "2.1+ (validated)";
}

}  // namespace ddp::store
