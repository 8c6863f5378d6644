#pragma once
// The rendezvous store: a key-value service every rank can reach, used to exchange addresses and
// agree on membership. Backed by libtorch's c10d::TCPStore, so it speaks the same wire protocol
// as torchrun's agent store and a Python torch.distributed job can share it.
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace ddp {

struct DistributedEnv;

class Store {
 public:
  // Hosts a store server on `port` (0 picks a free port) and connects to it.
  static std::shared_ptr<Store> host(int port, std::chrono::milliseconds timeout);
  // Connects to a store served at host:port, retrying until `timeout` (DNS may not be ready yet).
  static std::shared_ptr<Store> connect(const std::string& host, int port,
                                        std::chrono::milliseconds timeout);
  // torchrun's contract: a client of the launcher's store when TORCHELASTIC_USE_AGENT_STORE is
  // set, else rank 0 hosts MASTER_ADDR:MASTER_PORT and the other ranks connect to it.
  static std::shared_ptr<Store> from_env(const DistributedEnv& env,
                                         std::chrono::milliseconds timeout);

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

  // A view whose keys all live under "<prefix>/": lets independent groups share one server.
  std::shared_ptr<Store> with_prefix(const std::string& prefix) const;

  const std::string& prefix() const { return prefix_; }
  const std::string& endpoint_host() const;
  int port() const;
  std::chrono::milliseconds timeout() const;

  // The underlying c10d store, for code that speaks c10d itself (see ddp/store_c10d.h).
  struct Impl;
  const std::shared_ptr<Impl>& impl() const { return impl_; }

 private:
  Store(std::shared_ptr<Impl> impl, std::string prefix);
  std::string full_key(const std::string& key) const;

  std::shared_ptr<Impl> impl_;
  std::string prefix_;
};

}  // namespace ddp
