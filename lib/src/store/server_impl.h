#pragma once
// The store server's state, shared by its two halves: server.cpp (sockets, the epoll loop,
// reading and writing connections) and server_queries.cpp (the keys, and one handler per query
// of the c10d protocol). Private to src/store/.
#include <atomic>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "ddp/store_server.h"
#include "store/wire.h"

namespace ddp::store {

struct Connection {
  int fd = -1;
  std::string peer;  // ip:port, for log lines
  std::string peer_ip;
  std::optional<Dialect> dialect;
  bool admitted = false;
  bool agent = false;       // admitted by proving the join token (join_auth.h)
  std::string agent_nonce;  // the join handshake in progress: the agent's nonce
  std::string store_nonce;  // and the one this server answered it with
  bool closing = false;     // close once `out` is flushed; read nothing more
  std::string in;
  std::size_t in_pos = 0;  // requests before it are served
  std::size_t need = 0;    // bytes `in` must hold before the next request can be complete
  std::string out;
  std::size_t out_pos = 0;
  std::size_t awaited = 0;                // keys a WAIT still waits for
  std::vector<std::string> awaited_keys;  // to leave the waiting lists on close or cancel
  std::vector<std::string> watched_keys;  // legacy WATCH_KEY registrations
  bool want_write = false;
};

// One parsed request: its connection, its arguments as they arrive, and its answer.
struct Query {
  uint64_t id;
  Connection& c;
  Op op;
  Reader& r;
  Writer& out;
};

// What a query's handler did with it.
enum class Served {
  kDone,        // answered (or needs no answer); the request's bytes are used
  kIncomplete,  // its bytes have not all arrived: parse it again once they have
  kRefused,     // the connection may not ask it before presenting the join token
};

}  // namespace ddp::store

namespace ddp {

struct StoreServer::Impl {
  using Connection = store::Connection;
  using Query = store::Query;
  using Served = store::Served;

  StoreServerOptions options;
  store::Limits limits;
  int listen_fd = -1;
  int epoll_fd = -1;
  int wake_fd = -1;
  int port = 0;
  std::thread loop;
  // Admission by address (with a join token): this host's own addresses, and those an agent
  // that proved the token is connected from (open connections per address), less any that are
  // not among the members the agents last named (admit_members; nullopt: not named yet).
  std::unordered_set<std::string> local_ips;
  std::unordered_map<std::string, int> agent_ips;
  std::mutex members_mu;
  std::optional<std::unordered_set<std::string>> members;

  std::unordered_map<uint64_t, Connection> conns;
  uint64_t next_id = 2;
  std::unordered_map<std::string, std::string> data;
  std::unordered_map<std::string, std::deque<std::string>> queues;
  std::unordered_map<std::string, std::vector<uint64_t>> waiting;   // key -> connections
  std::unordered_map<std::string, std::vector<uint64_t>> watchers;  // key -> connections

  store::Limits unadmitted_limits{256, 4096, 0};
  bool listener_paused = false;  // out of file descriptors: accept again once one closes

  std::atomic<uint64_t> accepted{0}, refused{0}, protocol_errors{0}, open{0}, agents{0};

  explicit Impl(const StoreServerOptions& o) : options(o) {
    limits.max_key = o.max_key_bytes;
    limits.max_value = o.max_value_bytes;
    limits.max_keys_per_query = o.max_keys_per_query;
  }

  // ---- server.cpp: sockets and connections ----
  void listen_on(int wanted_port);
  void run();
  void accept_all();
  void on_readable(uint64_t id);
  void on_writable(uint64_t id);
  void close_conn(uint64_t id);
  void update_interest(uint64_t id, Connection& c);
  void send(uint64_t id, Connection& c, std::string bytes);
  void clear_wait(uint64_t id, Connection& c);
  // Whether a connection from `ip` is admitted without proving the token (a worker's).
  bool address_admitted(const std::string& ip);

  // ---- server_queries.cpp: the keys and the queries ----
  // Parses and serves one request from the front of c.in: the bytes it used, 0 if incomplete.
  std::size_t serve_one(uint64_t id, Connection& c);
  using Handler = Served (Impl::*)(Query&);
  static Handler handler_for(store::Op op);
  // Whether a connection that has not presented the join token may send `op`.
  static bool open_before_admission(store::Op op);
  Served on_validate(Query& q);
  Served on_ping(Query& q);
  Served on_num_keys(Query& q);
  Served on_compare_set(Query& q);
  Served on_set(Query& q);
  Served on_get(Query& q);
  Served on_add(Query& q);
  Served on_check(Query& q);
  Served on_wait(Query& q);
  Served on_multi_get(Query& q);
  Served on_delete_key(Query& q);
  Served on_append(Query& q);
  Served on_multi_set(Query& q);
  Served on_cancel_wait(Query& q);
  Served on_watch_key(Query& q);
  Served on_queue_push(Query& q);
  Served on_queue_pop(Query& q);
  Served on_queue_len(Query& q);
  Served on_list_keys(Query& q);
  Served on_barrier(Query& q);

  bool keys_present(const std::vector<std::string>& keys) const;
  // Stores `value` at `key`, then wakes its waiters and tells its watchers (created or updated).
  void put(const std::string& key, std::string value);
  // The key's value, empty when it is missing (as torch's libuv server answers).
  std::string_view value_of(const std::string& key) const;
  void changed(const std::string& key, uint8_t watch_type, const std::string& old_value,
               const std::string& new_value);
  void wake_one(const std::string& key);
  // The join handshake (join_auth.h): the answer to what an agent presented on kJoinKey.
  std::string join(Connection& c, const std::string& presented);
  std::string challenge(Connection& c, std::string_view agent_nonce);
  std::string check_proof(Connection& c, std::string_view proof);
  // Refuses the handshake (a log line naming the peer; the connection closes): the answer.
  std::string refuse_join(Connection& c, const std::string& why);
  // Closes a connection that is not admitted (after a log line); returns `unread`.
  std::size_t refuse(Connection& c, store::Op op, std::size_t unread);
};

}  // namespace ddp
