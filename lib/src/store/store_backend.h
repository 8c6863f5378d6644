#pragma once
// What a rendezvous store client talks to: ddp::Store applies its key prefix and forwards every
// operation to one of these. Two backends: the c10d TCPStore protocol (tcp_backend.h) and etcd's
// v3 API through its JSON gateway (etcd_backend.h). Every key given here is a full key (the
// Store's prefix already applied); every failure is a ddp::StoreError of one line that names the
// operation and the endpoint.
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "ddp/store.h"

namespace ddp::detail {

class StoreBackend {
 public:
  virtual ~StoreBackend() = default;

  virtual void set(const std::string& key, const std::string& value) = 0;
  // Reads a key that exists: the Store waits for it first.
  virtual std::string get(const std::string& key) = 0;
  // Adds `delta` atomically and returns the new value (a missing key counts as 0).
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  // c10d's compare-and-set: see Store::compare_set.
  virtual std::string compare_set(const std::string& key, const std::string& expected,
                                  const std::string& desired) = 0;
  // Whether every key exists.
  virtual bool check(const std::vector<std::string>& keys) = 0;
  // Returns once every key exists; throws a StoreError when `timeout` passes first.
  virtual void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) = 0;
  // Whether the key existed.
  virtual bool remove(const std::string& key) = 0;
  virtual void append(const std::string& key, const std::string& value) = 0;
  // Reads keys that exist (the Store waits for them first), in order.
  virtual std::vector<std::string> multi_get(const std::vector<std::string>& keys) = 0;
  // keys.size() == values.size() (the Store checks).
  virtual void multi_set(const std::vector<std::string>& keys,
                         const std::vector<std::string>& values) = 0;
  virtual int64_t num_keys() = 0;
  // The full keys that start with `prefix` ("": all), sorted. Backends that cannot list keys
  // (a binding's store) keep this default, which says so.
  virtual std::vector<std::string> list_keys(const std::string& prefix);

  virtual const std::string& endpoint_host() const = 0;
  // The address the server saw this client connect from, as it answered the join handshake;
  // "" when none was run (no token, or a store that is not a c10d server).
  virtual std::string seen_as() const { return ""; }
  virtual int port() const = 0;
  // How long one request may take.
  virtual std::chrono::milliseconds timeout() const = 0;
  virtual StoreProtocol protocol() const = 0;
  // "tcp" or "etcd".
  virtual const char* name() const = 0;
};

}  // namespace ddp::detail
