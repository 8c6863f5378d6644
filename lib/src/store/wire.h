#pragma once
// The c10d TCPStore wire protocol, in both of its dialects, for the server (server.cpp,
// server_queries.cpp) and the client (tcp_backend.cpp). Every request is one query byte followed by
// its arguments; integers are little-endian, and a string or byte vector is a uint64 length and its
// bytes.
//
//   legacy (PyTorch 1.13 and 2.0): SET=0 COMPARE_SET=1 GET=2 ADD=3 CHECK=4 WAIT=5 GETNUMKEYS=6
//     WATCH_KEY=7 DELETE_KEY=8, and from 2.0 APPEND=9 MULTI_GET=10 MULTI_SET=11 CANCEL_WAIT=12.
//   modern (PyTorch 2.1 and later): every connection opens with VALIDATE=0 and the magic
//     0x3C85F7CE; SET=1 COMPARE_SET=2 GET=3 ADD=4 CHECK=5 WAIT=6 GETNUMKEYS=7 DELETE_KEY=8
//     APPEND=9 MULTI_GET=10 MULTI_SET=11 CANCEL_WAIT=12 PING=13 QUEUE_PUSH=14 QUEUE_POP=15
//     QUEUE_LEN=16.
//
// A server tells them apart by a connection's first five bytes (0 and the magic: modern). The
// legacy SET that also starts with 0 is followed by a uint64 key length whose low half would
// have to equal the magic, a key of about 1 GB, far above the key limit.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>

namespace ddp::store {

inline constexpr uint32_t kValidationMagic = 0x3C85F7CE;

// The key on which an agent presents the job's join token: a COMPARE_SET with the token as
// `expected` and "" as `desired`, answered "ok" (admitted), "open" (the server checks no token)
// or "refused: <why>". ddprun's own extension; torch's servers answer it as any other key.
inline constexpr const char* kJoinKey = "__ddprun_join_token__";

enum class Dialect : uint8_t { kLegacy, kModern };

// What a request asks, whichever dialect carried it.
enum class Op : uint8_t {
  kValidate,
  kSet,
  kCompareSet,
  kGet,
  kAdd,
  kCheck,
  kWait,
  kNumKeys,
  kWatchKey,
  kDeleteKey,
  kAppend,
  kMultiGet,
  kMultiSet,
  kCancelWait,
  kPing,
  kQueuePush,
  kQueuePop,
  kQueueLen,
  kListKeys,  // 2.10+
  kBarrier,   // after LIST_KEYS on PyTorch main
};

// The op a query byte means in `dialect`, or nullopt for a byte that means nothing there.
std::optional<Op> decode_op(Dialect dialect, uint8_t byte);
// The query byte for `op` in `dialect`, or nullopt where the dialect lacks the op.
std::optional<uint8_t> encode_op(Dialect dialect, Op op);
const char* op_name(Op op);
const char* dialect_name(Dialect dialect);

// Responses that are one byte.
inline constexpr uint8_t kCheckReady = 0;
inline constexpr uint8_t kCheckNotReady = 1;
inline constexpr uint8_t kStopWaiting = 0;
inline constexpr uint8_t kWaitCanceled = 1;
// Legacy WATCH_KEY notifications: the type, then the key, the old and the new value.
inline constexpr uint8_t kWatchKeyUpdated = 0;
inline constexpr uint8_t kWatchKeyCreated = 1;
inline constexpr uint8_t kWatchKeyDeleted = 2;
inline constexpr uint8_t kWatchCallbackRegistered = 3;
inline constexpr uint8_t kWatchKeyAppended = 4;

// Builds a message.
class Writer {
 public:
  Writer& u8(uint8_t v) {
    buf_.push_back(static_cast<char>(v));
    return *this;
  }
  template <typename T>
  Writer& value(T v) {
    static_assert(std::is_trivially_copyable_v<T>);
    char raw[sizeof(T)];
    std::memcpy(raw, &v, sizeof(T));
    buf_.append(raw, sizeof(T));
    return *this;
  }
  Writer& bytes(std::string_view s) {
    value<uint64_t>(s.size());
    buf_.append(s.data(), s.size());
    return *this;
  }
  std::string& data() { return buf_; }

 private:
  std::string buf_;
};

// Reads a message that may not have fully arrived yet: every read returns false when the bytes
// are not there (the caller waits for more and parses again from the start of the request),
// and throws ProtocolError when a length is beyond `limits`.
struct Limits {
  std::size_t max_key = 64 * 1024;
  std::size_t max_value = 64 * 1024 * 1024;
  std::size_t max_keys_per_query = 128 * 1024;
};

class ProtocolError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class Reader {
 public:
  Reader(std::string_view data, const Limits& limits) : data_(data), limits_(limits) {}

  bool u8(uint8_t& v) { return value(v); }
  template <typename T>
  bool value(T& v) {
    if (data_.size() - pos_ < sizeof(T)) return missing(sizeof(T));
    std::memcpy(&v, data_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  bool key(std::string& out) { return sized(out, limits_.max_key, "key"); }
  bool payload(std::string& out) { return sized(out, limits_.max_value, "value"); }
  bool count(uint64_t& n) {
    if (!value(n)) return false;
    if (n > limits_.max_keys_per_query) {
      throw ProtocolError("a query of " + std::to_string(n) + " keys (the limit is " +
                          std::to_string(limits_.max_keys_per_query) + ")");
    }
    return true;
  }
  std::size_t consumed() const { return pos_; }
  // After a read returned false: how many bytes from the start of the data the request needs
  // at least, so that a caller need not parse it again before they have arrived.
  std::size_t needed() const { return needed_; }

 private:
  bool missing(std::size_t n) {
    needed_ = pos_ + n;
    return false;
  }
  bool sized(std::string& out, std::size_t limit, const char* what) {
    uint64_t n = 0;
    if (!value(n)) return false;
    if (n > limit) {
      throw ProtocolError(std::string("a ") + what + " of " + std::to_string(n) +
                          " bytes (the limit is " + std::to_string(limit) + ")");
    }
    if (data_.size() - pos_ < n) return missing(static_cast<std::size_t>(n));
    out.assign(data_.data() + pos_, static_cast<std::size_t>(n));
    pos_ += static_cast<std::size_t>(n);
    return true;
  }

  std::string_view data_;
  const Limits& limits_;
  std::size_t pos_ = 0;
  std::size_t needed_ = 0;
};

}  // namespace ddp::store
