#include "ddp/store.h"

#include <algorithm>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "ddp/env.h"
#include "ddp/error.h"
#include "ddp/log.h"
#include "ddp/store_c10d.h"
#include "net/tcp_probe.h"

namespace ddp {

struct Store::Impl {
  c10::intrusive_ptr<c10d::TCPStore> tcp;
  std::string host;
};

namespace {

std::vector<uint8_t> to_bytes(const std::string& s) { return {s.begin(), s.end()}; }
std::string from_bytes(const std::vector<uint8_t>& v) { return {v.begin(), v.end()}; }

// c10d rounds its connect timeout down to whole seconds (0 s fails at once), so connecting
// always gets at least one second; operations then use the caller's timeout.
std::chrono::milliseconds connect_timeout(std::chrono::milliseconds t) {
  return std::max<std::chrono::milliseconds>(t, std::chrono::seconds(1));
}

std::string seconds(std::chrono::milliseconds t) {
  return std::to_string(t.count() / 1000.0).substr(0, 6) + " s";
}

// c10d reports socket and timeout problems as c10::Error; callers want our one-line StoreError.
template <typename Fn>
auto translate(const std::string& what, Fn&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const ddp::Error&) {
    throw;
  } catch (const std::exception& e) {
    std::string cause = e.what();
    // c10::Error appends a C++ backtrace after the first line; keep the first line only.
    if (auto nl = cause.find('\n'); nl != std::string::npos) cause.resize(nl);
    throw StoreError("rendezvous store: " + what + " failed: " + cause);
  }
}

}  // namespace

Store::Store(std::shared_ptr<Impl> impl, std::string prefix)
    : impl_(std::move(impl)), prefix_(std::move(prefix)) {}

Store::~Store() = default;

std::shared_ptr<Store> Store::host(int port, std::chrono::milliseconds timeout) {
  c10d::TCPStoreOptions opts;
  opts.port = static_cast<std::uint16_t>(port);
  opts.isServer = true;
  opts.waitWorkers = false;
  opts.timeout = connect_timeout(timeout);
  opts.multiTenant = true;
  auto impl = std::make_shared<Impl>();
  impl->host = "127.0.0.1";
  impl->tcp = translate("hosting on port " + std::to_string(port),
                        [&] { return c10::make_intrusive<c10d::TCPStore>(impl->host, opts); });
  return std::shared_ptr<Store>(new Store(std::move(impl), ""));
}

std::shared_ptr<Store> Store::connect(const std::string& host, int port,
                                      std::chrono::milliseconds timeout) {
  const auto unreachable = [&](const std::string& cause) {
    return StoreError("cannot reach the rendezvous store at " + host + ":" + std::to_string(port) +
                      " within " + seconds(timeout) + " (" + cause +
                      "); check MASTER_ADDR/MASTER_PORT and that the rank-0 host is running");
  };
  if (!net::wait_for_listener(host, port, std::chrono::steady_clock::now() + timeout)) {
    throw unreachable("nothing accepted a connection there");
  }
  c10d::TCPStoreOptions opts;
  opts.port = static_cast<std::uint16_t>(port);
  opts.isServer = false;
  opts.waitWorkers = false;
  opts.timeout = connect_timeout(timeout);
  auto impl = std::make_shared<Impl>();
  impl->host = host;
  try {
    impl->tcp = c10::make_intrusive<c10d::TCPStore>(host, opts);
    impl->tcp->setTimeout(timeout);
  } catch (const std::exception& e) {
    std::string cause = e.what();
    if (auto nl = cause.find('\n'); nl != std::string::npos) cause.resize(nl);
    throw unreachable(cause);
  }
  return std::shared_ptr<Store>(new Store(std::move(impl), ""));
}

std::shared_ptr<Store> Store::from_env(const DistributedEnv& env,
                                       std::chrono::milliseconds timeout) {
  if (env.world_size == 1 && !env.use_agent_store) return host(0, timeout);
  if (env.rank == 0 && !env.use_agent_store) {
    auto store = host(env.master_port, timeout);
    log::debug("hosting the rendezvous store on port {}", env.master_port);
    return store;
  }
  return connect(env.master_addr, env.master_port, timeout);
}

std::string Store::full_key(const std::string& key) const {
  return prefix_.empty() ? key : prefix_ + "/" + key;
}

void Store::set(const std::string& key, const std::string& value) {
  translate("set '" + full_key(key) + "'",
            [&] { impl_->tcp->set(full_key(key), to_bytes(value)); });
}

std::string Store::get(const std::string& key) {
  return translate("get '" + full_key(key) + "' (waited " + seconds(timeout()) + ")",
                   [&] { return from_bytes(impl_->tcp->get(full_key(key))); });
}

int64_t Store::add(const std::string& key, int64_t delta) {
  return translate("add '" + full_key(key) + "'",
                   [&] { return impl_->tcp->add(full_key(key), delta); });
}

std::string Store::compare_set(const std::string& key, const std::string& expected,
                               const std::string& desired) {
  return translate("compare_set '" + full_key(key) + "'", [&] {
    return from_bytes(impl_->tcp->compareSet(full_key(key), to_bytes(expected), to_bytes(desired)));
  });
}

bool Store::check(const std::vector<std::string>& keys) {
  std::vector<std::string> full;
  for (const auto& k : keys) full.push_back(full_key(k));
  return translate("check", [&] { return impl_->tcp->check(full); });
}

void Store::wait(const std::vector<std::string>& keys) { wait(keys, timeout()); }

void Store::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  std::vector<std::string> full;
  for (const auto& k : keys) full.push_back(full_key(k));
  translate("wait for " + std::to_string(keys.size()) + " key(s) starting '" +
                (full.empty() ? std::string() : full.front()) + "' (" + seconds(timeout) + ")",
            [&] { impl_->tcp->wait(full, timeout); });
}

bool Store::remove(const std::string& key) {
  return translate("delete '" + full_key(key) + "'",
                   [&] { return impl_->tcp->deleteKey(full_key(key)); });
}

std::shared_ptr<Store> Store::with_prefix(const std::string& prefix) const {
  return std::shared_ptr<Store>(new Store(impl_, full_key(prefix)));
}

const std::string& Store::endpoint_host() const { return impl_->host; }
int Store::port() const { return impl_->tcp->getPort(); }
std::chrono::milliseconds Store::timeout() const { return impl_->tcp->getTimeout(); }

c10::intrusive_ptr<c10d::Store> to_c10d(const Store& store) {
  c10::intrusive_ptr<c10d::Store> base = store.impl()->tcp;
  if (store.prefix().empty()) return base;
  return c10::make_intrusive<c10d::PrefixStore>(store.prefix(), base);
}

}  // namespace ddp
