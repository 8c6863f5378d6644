#include "ddp/store.h"

#include <utility>

#include "ddp/env.h"
#include "ddp/error.h"
#include "ddp/log.h"
#include "ddp/store_server.h"
#include "store/etcd_backend.h"
#include "store/store_backend.h"
#include "store/tcp_backend.h"

namespace ddp {

using std::chrono::milliseconds;

const char* to_string(StoreProtocol protocol) {
  switch (protocol) {
    case StoreProtocol::kLegacy:
      return "legacy (1.13/2.0)";
    case StoreProtocol::kModern:
      return "modern (2.1+)";
    case StoreProtocol::kAuto:
      break;
  }
  return "auto";
}

Store::Store(std::shared_ptr<detail::StoreBackend> backend, std::string prefix)
    : backend_(std::move(backend)), prefix_(std::move(prefix)) {}

Store::~Store() = default;

std::shared_ptr<Store> Store::adopt(std::shared_ptr<detail::StoreBackend> backend) {
  return std::shared_ptr<Store>(new Store(std::move(backend), ""));
}

std::shared_ptr<Store> Store::host(int port, milliseconds timeout, const std::string& join_token) {
  StoreServerOptions options;
  options.port = port;
  options.join_token = join_token;
  auto server = std::make_shared<const StoreServer>(options);
  auto backend = detail::TcpStoreBackend::connect("127.0.0.1", server->port(), timeout,
                                                  {std::nullopt, StoreProtocol::kModern});
  backend->keep_alive(std::move(server));
  return std::shared_ptr<Store>(new Store(std::move(backend), ""));
}

std::shared_ptr<Store> Store::connect(const std::string& host, int port, milliseconds timeout,
                                      const StoreConnectOptions& options) {
  return std::shared_ptr<Store>(
      new Store(detail::TcpStoreBackend::connect(host, port, timeout, options), ""));
}

std::shared_ptr<Store> Store::from_env(const DistributedEnv& env, milliseconds timeout) {
  if (env.world_size == 1 && !env.use_agent_store) return host(0, timeout);
  if (env.rank == 0 && !env.use_agent_store) {
    auto store = host(env.master_port, timeout);
    log::debug("hosting the rendezvous store on port {}", env.master_port);
    return store;
  }
  return connect(env.master_addr, env.master_port, timeout);
}

std::shared_ptr<Store> Store::etcd(const EtcdOptions& options, milliseconds timeout,
                                   milliseconds request_timeout) {
  return std::shared_ptr<Store>(
      new Store(detail::connect_etcd(options, timeout, request_timeout), ""));
}

std::shared_ptr<Store> Store::etcd(const EtcdOptions& options, milliseconds timeout) {
  return etcd(options, timeout, timeout);
}

std::string Store::full_key(const std::string& key) const {
  return prefix_.empty() ? key : prefix_ + "/" + key;
}

std::vector<std::string> Store::full_keys(const std::vector<std::string>& keys) const {
  std::vector<std::string> full;
  full.reserve(keys.size());
  for (const auto& k : keys) full.push_back(full_key(k));
  return full;
}

void Store::set(const std::string& key, const std::string& value) {
  backend_->set(full_key(key), value);
}

std::string Store::get(const std::string& key) {
  wait({key});
  return backend_->get(full_key(key));
}

int64_t Store::add(const std::string& key, int64_t delta) {
  return backend_->add(full_key(key), delta);
}

std::string Store::compare_set(const std::string& key, const std::string& expected,
                               const std::string& desired) {
  return backend_->compare_set(full_key(key), expected, desired);
}

bool Store::check(const std::vector<std::string>& keys) { return backend_->check(full_keys(keys)); }

void Store::wait(const std::vector<std::string>& keys) { wait(keys, timeout()); }

void Store::wait(const std::vector<std::string>& keys, milliseconds timeout) {
  backend_->wait(full_keys(keys), timeout);
}

bool Store::remove(const std::string& key) { return backend_->remove(full_key(key)); }

void Store::append(const std::string& key, const std::string& value) {
  backend_->append(full_key(key), value);
}

std::vector<std::string> Store::multi_get(const std::vector<std::string>& keys) {
  wait(keys);
  return backend_->multi_get(full_keys(keys));
}

void Store::multi_set(const std::vector<std::string>& keys,
                      const std::vector<std::string>& values) {
  if (keys.size() != values.size()) {
    throw StoreError("multi_set: " + std::to_string(keys.size()) + " keys but " +
                     std::to_string(values.size()) + " values");
  }
  backend_->multi_set(full_keys(keys), values);
}

int64_t Store::num_keys() { return backend_->num_keys(); }

std::vector<std::string> Store::list_keys() {
  const std::string under = prefix_.empty() ? "" : prefix_ + "/";
  std::vector<std::string> keys = backend_->list_keys(under);
  for (std::string& key : keys) key.erase(0, under.size());
  return keys;
}

namespace detail {

std::vector<std::string> StoreBackend::list_keys(const std::string& /*prefix*/) {
  throw StoreError(std::string("list_keys: a ") + name() + " store cannot list its keys");
}

}  // namespace detail

std::shared_ptr<Store> Store::with_prefix(const std::string& prefix) const {
  return std::shared_ptr<Store>(new Store(backend_, full_key(prefix)));
}

const std::string& Store::endpoint_host() const { return backend_->endpoint_host(); }
int Store::port() const { return backend_->port(); }
std::string Store::seen_as() const { return backend_->seen_as(); }
milliseconds Store::timeout() const { return backend_->timeout(); }
StoreProtocol Store::protocol() const { return backend_->protocol(); }
const char* Store::backend_name() const { return backend_->name(); }

}  // namespace ddp
