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
// Join authentication, with a join token:
// - An agent proves it holds the token by a challenge–response over HMAC-SHA256 on kJoinKey
//   (src/store/join_auth.h): fresh nonces on both sides, so nothing on the wire can be replayed,
//   and the token never crosses it. The store proves it too.
// - Workers speak plain c10d and are admitted by their address: this host's own, and an address
//   from which an admitted agent is connected now. Once the agents named the round's members
//   (admit_members), only those of the members. So a node that leaves (its agent's connections
//   close) or is dropped from the members takes its admission with it, and a recycled address
//   is not admitted. Connections already open stay so.
// - A connection that is not admitted may only open the protocol (VALIDATE, PING, GETNUMKEYS)
//   and run the handshake; anything else is refused and the connection closed.
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

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
  uint64_t agents = 0;           // of those, agents admitted by the join token
};

class StoreServer {
 public:
  // The key an agent's COMPARE_SET runs the join handshake on (expected: the message, desired:
  // ""). The last answer is "ok <address>" (admitted; the agent's address as this server sees
  // it), "open" (this server checks no token) or "refused: <why>".
  static constexpr const char* kJoinKey = "__ddprun_join_token__";

  // Binds (IPv6 dual-stack, else IPv4) and starts serving. Throws StoreError when the port is
  // taken or no socket can be opened.
  explicit StoreServer(const StoreServerOptions& options);
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  int port() const;
  StoreServerStats stats() const;
  // The addresses ("ok <address>" of each member's agent) whose workers are admitted from now on,
  // replacing the previous set: a round's members, named by the agent that hosts the store.
  // Before the first call, any address an admitted agent is connected from. Thread-safe.
  void admit_members(const std::vector<std::string>& addresses);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddp
