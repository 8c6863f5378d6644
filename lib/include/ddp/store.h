#pragma once
// The rendezvous store: a key-value service every rank can reach, used to exchange addresses and
// agree on membership. It speaks c10d's TCPStore protocol without libtorch (see
// ddp/store_server.h), so a Python torch.distributed job can share it, and the client below can
// use a store hosted by torchrun or by a PyTorch script, 1.13 or 2.x alike.
//
// The client finds the server's protocol by itself: it opens the connection as PyTorch 2.1+ does
// (VALIDATE, then a PING whose nonce must come back) and falls back to the 1.13/2.0 protocol when
// the server closes the connection or does not answer within a short deadline instead.
// DDP_STORE_PROTOCOL=legacy|modern skips the probe.
//
// The same client can instead keep its keys in etcd (Store::etcd: the v3 API through etcd's JSON
// gateway), for a rendezvous that no node of the job hosts.
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace ddp {

struct DistributedEnv;

// Which wire protocol a client speaks: chosen by the probe, or set.
enum class StoreProtocol { kAuto, kLegacy, kModern };

struct StoreConnectOptions {
  // Agents present the job's join token (see StoreServer::kJoinKey) right after connecting; a
  // server that refuses it fails the connect with its reason. nullopt: present nothing (workers,
  // admitted by their address).
  std::optional<std::string> join_token;
  // kAuto reads DDP_STORE_PROTOCOL (auto, legacy or modern) and probes when it is unset or auto.
  StoreProtocol protocol = StoreProtocol::kAuto;
};

// Where etcd runs, and how to reach it (torchrun's --rdzv-conf keys for its etcd backends).
struct EtcdOptions {
  // "host:port", "[v6-address]:port" or "http(s)://host:port"; port 2379 when none. A scheme
  // given here wins over `protocol`.
  std::string endpoint;
  // "http" or "https".
  std::string protocol = "http";
  // https only: the CA bundle that signed etcd's certificate (else the system's), and this
  // client's certificate and key when etcd asks for one. Files, PEM.
  std::string cacert, cert, key;
};

namespace detail {
class StoreBackend;
}

class Store {
 public:
  // Hosts a store server on `port` (0 picks a free port) and connects to it. A non-empty
  // `join_token` admits connections from other hosts only once they presented it.
  static std::shared_ptr<Store> host(int port, std::chrono::milliseconds timeout,
                                     const std::string& join_token = "");
  // Connects to a store served at host:port, retrying until `timeout` (DNS may not be ready yet).
  static std::shared_ptr<Store> connect(const std::string& host, int port,
                                        std::chrono::milliseconds timeout,
                                        const StoreConnectOptions& options = {});
  // torchrun's contract: a client of the launcher's store when TORCHELASTIC_USE_AGENT_STORE is
  // set, else rank 0 hosts MASTER_ADDR:MASTER_PORT and the other ranks connect to it.
  static std::shared_ptr<Store> from_env(const DistributedEnv& env,
                                         std::chrono::milliseconds timeout);
  // Connects to etcd (v3 API through its JSON gateway, etcd 3.4 or newer), retrying until
  // `timeout` while the connection is refused (pods start in any order); each request then
  // gives up after `request_timeout` (the second form: `timeout`). libcurl (libcurl.so.4) is
  // loaded at run time; a host without it fails here, saying so. Keys are stored as they are
  // (give the Store a prefix with with_prefix); values and keys may hold any bytes.
  static std::shared_ptr<Store> etcd(const EtcdOptions& options, std::chrono::milliseconds timeout,
                                     std::chrono::milliseconds request_timeout);
  static std::shared_ptr<Store> etcd(const EtcdOptions& options, std::chrono::milliseconds timeout);

  // A store whose operations go to `backend`: a binding's own store (ddp/capi.h hands torch's
  // c10d Store through one), with no prefix.
  static std::shared_ptr<Store> adopt(std::shared_ptr<detail::StoreBackend> backend);

  ~Store();

  void set(const std::string& key, const std::string& value);
  // Waits up to the store timeout for the key to appear.
  std::string get(const std::string& key);
  // Atomically adds `delta` and returns the new value (a missing key counts as 0).
  int64_t add(const std::string& key, int64_t delta);
  // Sets `desired` if the current value equals `expected` (empty = key missing); returns the
  // value after the operation.
  std::string compare_set(const std::string& key, const std::string& expected,
                          const std::string& desired);
  bool check(const std::vector<std::string>& keys);
  void wait(const std::vector<std::string>& keys);
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout);
  bool remove(const std::string& key);
  // Appends to the key's value (creates it when missing).
  void append(const std::string& key, const std::string& value);
  // Waits for every key, then reads them all in one round trip (one per key from a 1.13
  // server, which has no MULTI_GET).
  std::vector<std::string> multi_get(const std::vector<std::string>& keys);
  void multi_set(const std::vector<std::string>& keys, const std::vector<std::string>& values);
  // Keys in the whole store (every prefix; with etcd, every key of the etcd cluster, other
  // applications' included).
  int64_t num_keys();
  // The keys under this Store's prefix, without it, sorted (torch 2.10's Store.list_keys). A c10d
  // server must be PyTorch 2.10+ or ddp's (older ones have no LIST_KEYS: one StoreError line says
  // so); etcd lists by range.
  std::vector<std::string> list_keys();

  // A view whose keys all live under "<prefix>/": lets independent groups share one server.
  std::shared_ptr<Store> with_prefix(const std::string& prefix) const;

  const std::string& prefix() const { return prefix_; }
  const std::string& endpoint_host() const;
  int port() const;
  // The address the server saw this client connect from, as it answered the join handshake
  // (an agent's, with a join token); "" when none was run.
  std::string seen_as() const;
  std::chrono::milliseconds timeout() const;
  // The protocol this client speaks with its server (never kAuto); kModern for etcd, which
  // speaks none of them (see backend_name()).
  StoreProtocol protocol() const;
  // Where the keys live: "tcp" (a c10d TCPStore server) or "etcd".
  const char* backend_name() const;

 private:
  Store(std::shared_ptr<detail::StoreBackend> backend, std::string prefix);
  std::string full_key(const std::string& key) const;
  std::vector<std::string> full_keys(const std::vector<std::string>& keys) const;

  std::shared_ptr<detail::StoreBackend> backend_;
  std::string prefix_;
};

// "legacy (1.13/2.0)" or "modern (2.1+)".
const char* to_string(StoreProtocol protocol);

}  // namespace ddp
