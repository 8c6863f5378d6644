#pragma once
// A rendezvous store server that speaks c10d's TCPStore protocol, written without libtorch. It
// serves PyTorch 1.13/2.0 clients and 2.1+ clients on one port, choosing per connection from its
// first bytes (see src/store/wire.h), with torch's semantics for every query: waits, compare-set,
// counters, append, multi-get/set, queues, cancelled waits and 1.13's key watches.
//
// One thread runs an epoll loop over every connection. Requests are parsed as their bytes
// arrive, never trusted for a length: a key, a value, a key count or a whole request beyond the
// limits closes that connection only (with a log line naming the peer), and a client that does
// not read its answers stops being read, so no client makes the server allocate without bound.
//
// Join authentication: with a join token, a connection from an address that is neither this
// host's nor that of an agent that presented the token may only open the protocol (VALIDATE,
// PING, GETNUMKEYS) and present the token; anything else is refused and the connection closed.
// An agent presents it with a COMPARE_SET of kJoinKey (see ddp::Store's join_token option).
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

namespace ddp {

struct StoreServerOptions {
  int port = 0;             // 0: any free port
  std::string join_token;   // empty: every address may connect (torchrun's behaviour)
  bool admit_local = true;  // with a token: this host's own addresses (its workers) need none
  std::size_t max_key_bytes = 64 * 1024;
  std::size_t max_value_bytes = 64 * 1024 * 1024;
  std::size_t max_keys_per_query = 128 * 1024;
  std::size_t max_request_bytes = 256 * 1024 * 1024;
  std::size_t max_connections = 65536;
};

struct StoreServerStats {
  uint64_t accepted = 0;
  uint64_t refused = 0;          // connections closed for lacking the join token
  uint64_t protocol_errors = 0;  // connections closed for a malformed or oversized request
  uint64_t open = 0;             // connections open now
};

class StoreServer {
 public:
  // The key an agent's COMPARE_SET presents the token on (expected: the token, desired: "").
  // The answer is "ok" (admitted), "open" (this server checks no token) or "refused: <why>".
  static constexpr const char* kJoinKey = "__ddprun_join_token__";

  // Binds (IPv6 dual-stack, else IPv4) and starts serving. Throws StoreError when the port is
  // taken or no socket can be opened.
  explicit StoreServer(const StoreServerOptions& options);
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  int port() const;
  StoreServerStats stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddp
