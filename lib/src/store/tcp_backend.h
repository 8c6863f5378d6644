#pragma once
// The store backend that speaks c10d's TCPStore protocol (store/wire.h) to a ddp::StoreServer, to
// torchrun's store, or to one a PyTorch script hosts; see ddp/store.h for how it finds the
// server's protocol.
#include <chrono>
#include <memory>
#include <string>

#include "ddp/store.h"
#include "store/store_backend.h"

namespace ddp::detail {

class TcpStoreBackend final : public StoreBackend {
 public:
  // Connects to a store served at host:port, retrying until `timeout` (DNS may not be ready
  // yet); throws a StoreError that names the endpoint, or a JoinRefusedError.
  static std::shared_ptr<TcpStoreBackend> connect(const std::string& host, int port,
                                                  std::chrono::milliseconds timeout,
                                                  const StoreConnectOptions& options);
  ~TcpStoreBackend() override;

  // Keeps `owned` (the server this process hosts) alive as long as the client: a store's host
  // is the layer above this one (store.cpp), which hands its server over type-erased.
  void keep_alive(std::shared_ptr<const void> owned);

  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  std::string compare_set(const std::string& key, const std::string& expected,
                          const std::string& desired) override;
  bool check(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  bool remove(const std::string& key) override;
  void append(const std::string& key, const std::string& value) override;
  std::vector<std::string> multi_get(const std::vector<std::string>& keys) override;
  void multi_set(const std::vector<std::string>& keys,
                 const std::vector<std::string>& values) override;
  int64_t num_keys() override;
  std::vector<std::string> list_keys(const std::string& prefix) override;

  const std::string& endpoint_host() const override;
  std::string seen_as() const override;
  int port() const override;
  std::chrono::milliseconds timeout() const override;
  StoreProtocol protocol() const override;
  const char* name() const override { return "tcp"; }

  struct Impl;

 private:
  explicit TcpStoreBackend(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddp::detail
