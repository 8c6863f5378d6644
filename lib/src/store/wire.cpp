#include "store/wire.h"

#include <array>
#include <iterator>

namespace ddp::store {
namespace {

// Index: query byte; value: the op it means.
constexpr std::array<Op, 13> kLegacy = {
    Op::kSet,      Op::kCompareSet, Op::kGet,       Op::kAdd,       Op::kCheck,
    Op::kWait,     Op::kNumKeys,    Op::kWatchKey,  Op::kDeleteKey, Op::kAppend,
    Op::kMultiGet, Op::kMultiSet,   Op::kCancelWait};
constexpr std::array<Op, 19> kModern = {
    Op::kValidate, Op::kSet,      Op::kCompareSet, Op::kGet,       Op::kAdd,
    Op::kCheck,    Op::kWait,     Op::kNumKeys,    Op::kDeleteKey, Op::kAppend,
    Op::kMultiGet, Op::kMultiSet, Op::kCancelWait, Op::kPing,      Op::kQueuePush,
    Op::kQueuePop, Op::kQueueLen, Op::kListKeys,   Op::kBarrier};

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
  // In the order of Op.
  static constexpr const char* kNames[] = {"VALIDATE",  "SET",         "COMPARE_SET", "GET",
                                           "ADD",       "CHECK",       "WAIT",        "GETNUMKEYS",
                                           "WATCH_KEY", "DELETE_KEY",  "APPEND",      "MULTI_GET",
                                           "MULTI_SET", "CANCEL_WAIT", "PING",        "QUEUE_PUSH",
                                           "QUEUE_POP", "QUEUE_LEN",   "LIST_KEYS",   "BARRIER"};
  static_assert(std::size(kNames) == static_cast<std::size_t>(Op::kBarrier) + 1);
  return kNames[static_cast<std::size_t>(op)];
}

const char* dialect_name(Dialect dialect) {
  return dialect == Dialect::kLegacy ? "1.13/2.0 (legacy)" : "2.1+ (validated)";
}

}  // namespace ddp::store
