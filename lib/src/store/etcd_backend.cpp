#include "store/etcd_backend.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <random>
#include <thread>
#include <utility>
#include <vector>

#include "ddp/error.h"
#include "ddp/log.h"
#include "store/c10d.h"
#include "store/etcd_curl.h"
#include "store/etcd_json.h"

namespace ddp::detail {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// etcd's default --max-txn-ops: a transaction of more operations is refused.
constexpr std::size_t kMaxTxnOps = 128;
constexpr int kDefaultPort = 2379;

std::string seconds(milliseconds t) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f s", static_cast<double>(t.count()) / 1000.0);
  return text;
}

// "describe 3 key(s) starting 'k'".
std::string keys_what(const char* op, const std::vector<std::string>& keys) {
  return std::string(op) + " " + std::to_string(keys.size()) + " key(s) starting '" +
         (keys.empty() ? std::string() : keys.front()) + "'";
}

StoreError not_a_counter(const std::string& value) {
  return StoreError("its value '" + value + "' is not an integer");
}

// A counter's value (store/c10d.h), or a StoreError.
int64_t counter(const std::string& value) {
  const auto parsed = store::counter_value(value);
  if (!parsed) throw not_a_counter(value);
  return *parsed;
}

bool readable(const std::string& path, std::string& why) {
  if (access(path.c_str(), R_OK) == 0) return true;
  why = std::strerror(errno);
  return false;
}

// ---- the backend ------------------------------------------------------------------------------

class EtcdBackend final : public StoreBackend {
 public:
  EtcdBackend(const EtcdEndpoint& endpoint, const EtcdOptions& options, milliseconds timeout)
      : host_(endpoint.host),
        port_(endpoint.port),
        timeout_(timeout),
        where_((endpoint.host.find(':') != std::string::npos ? "[" + endpoint.host + "]"
                                                             : endpoint.host) +
               ":" + std::to_string(endpoint.port)),
        https_(endpoint.scheme == "https"),
        http_(endpoint.scheme + "://" + where_, https_, options) {}

  EtcdBackend(const EtcdBackend&) = delete;
  EtcdBackend& operator=(const EtcdBackend&) = delete;

  // The first request, retried while nothing answers; see connect_etcd.
  void connect(milliseconds connect_timeout) {
    const auto start = Clock::now();
    const auto deadline = start + connect_timeout;
    const std::string path = "/v3/kv/range";
    const std::string body =
        json{{"key", base64_encode(std::string(1, '\0'))}, {"count_only", true}}.dump();
    auto backoff = milliseconds(50);
    std::string last_cause;
    for (;;) {
      const HttpReply reply = http_.post(path, body, deadline);
      std::string cause;
      bool retry = false;
      if (reply.code != CURLE_OK) {
        cause = http_.transport_cause(reply);
        retry = HttpPoster::retryable(reply.code);
        if (!retry) {
          throw StoreError("cannot reach etcd at " + where_ + " (" + cause + "); " +
                           (HttpPoster::tls_failure(reply.code)
                                ? "check --rdzv-conf protocol, cacert, cert and key"
                                : "check --rdzv-endpoint and that etcd runs there"));
        }
      } else if (reply.status == 200) {
        const json answer = json::parse(reply.body, nullptr, false);
        if (answer.is_object() && answer.contains("header")) return;
        throw StoreError("the server at " + where_ + " answered " + path +
                         " with something other than etcd's JSON: is this etcd 3.4 or newer? "
                         "check --rdzv-endpoint");
      } else {
        const std::string message = etcd_message(reply.body);
        if (message.empty()) throw StoreError(not_etcd(reply, path));
        cause = "HTTP " + std::to_string(reply.status) + ": " + message;
        // 5xx: etcd runs but cannot serve yet (no leader while its cluster forms).
        retry = reply.status >= 500;
        if (!retry) throw StoreError("etcd at " + where_ + " refused this client (" + cause + ")");
      }
      // A last try cut short by the deadline says less than the one before it.
      if (last_cause.empty() || reply.code != CURLE_OPERATION_TIMEDOUT) last_cause = cause;
      const auto now = Clock::now();
      if (now >= deadline) {
        throw StoreUnreachableError("cannot reach etcd at " + where_ + " within " +
                                        seconds(connect_timeout) + " (" + last_cause +
                                        "); check --rdzv-endpoint and that etcd runs there",
                                    last_cause);
      }
      std::this_thread::sleep_for(std::min<Clock::duration>(backoff, deadline - now));
      backoff = std::min(backoff * 2, milliseconds(1000));
    }
  }

  void set(const std::string& key, const std::string& value) override {
    guarded("put '" + key + "'", [&] {
      request("/v3/kv/put", {{"key", base64_encode(key)}, {"value", base64_encode(value)}},
              Clock::now() + timeout_);
    });
  }

  std::string get(const std::string& key) override {
    return guarded("get '" + key + "'", [&] {
      const Seen seen =
          first_kv(request("/v3/kv/range", {{"key", base64_encode(key)}}, Clock::now() + timeout_));
      if (!seen.exists) throw StoreError("no such key");
      return seen.value;
    });
  }

  int64_t add(const std::string& key, int64_t delta) override {
    return guarded("add '" + key + "'", [&] {
      if (delta == 0) {
        // A read of a counter (polling loops do it): one range, no transaction.
        const Seen seen = first_kv(
            request("/v3/kv/range", {{"key", base64_encode(key)}}, Clock::now() + timeout_));
        return seen.exists ? counter(seen.value) : int64_t{0};
      }
      int64_t result = 0;
      update(key, [&](const Seen& seen) {
        const auto value = store::counter_after_add(seen.exists ? &seen.value : nullptr, delta);
        if (!value) throw not_a_counter(seen.value);
        result = *value;
        return std::to_string(result);
      });
      return result;
    });
  }

  std::string compare_set(const std::string& key, const std::string& expected,
                          const std::string& desired) override {
    return guarded("compare_set '" + key + "'", [&] {
      const auto deadline = Clock::now() + timeout_;
      json compare = expected.empty() ? version_is_zero(key) : value_is(key, expected);
      for (;;) {
        const json reply = txn(json::array({compare}), json::array({put_op(key, desired)}),
                               json::array({range_op(key)}), deadline);
        if (bool_field(reply, "succeeded")) return desired;
        const Seen seen = first_kv(txn_answer(reply, 0, "response_range"));
        const auto outcome =
            store::compare_set(seen.exists ? &seen.value : nullptr, expected, desired);
        if (!outcome.write) return std::string(outcome.answer);
        // It matches, but the comparison did not see it so (an existing empty value for an
        // empty `expected`, or the key changed in between): compare what was just seen.
        compare = seen.exists ? mod_revision_is(key, seen.mod_revision) : version_is_zero(key);
        give_up_at(deadline);
      }
    });
  }

  bool check(const std::vector<std::string>& keys) override {
    return guarded(keys_what("check", keys),
                   [&] { return all_exist(keys, Clock::now() + timeout_); });
  }

  void wait(const std::vector<std::string>& keys, milliseconds timeout) override {
    const std::string what = "wait for " + std::to_string(keys.size()) + " key(s) starting '" +
                             (keys.empty() ? std::string() : keys.front()) + "' (" +
                             seconds(timeout) + ")";
    guarded(what, [&] {
      const auto deadline = Clock::now() + timeout;
      auto backoff = milliseconds(5);
      for (;;) {
        // Each check may outlast the wait by a little, not by a whole request timeout.
        const auto now = Clock::now();
        const auto check_deadline = std::min(
            now + timeout_, std::max<Clock::time_point>(deadline, now + milliseconds(200)));
        if (all_exist(keys, check_deadline)) return;
        const auto after = Clock::now();
        if (after >= deadline) throw StoreError("timed out");
        std::this_thread::sleep_for(std::min<Clock::duration>(backoff, deadline - after));
        backoff = std::min(backoff * 2, milliseconds(100));
      }
    });
  }

  bool remove(const std::string& key) override {
    return guarded("delete '" + key + "'", [&] {
      const json reply =
          request("/v3/kv/deleterange", {{"key", base64_encode(key)}}, Clock::now() + timeout_);
      return int_field(reply, "deleted") > 0;
    });
  }

  void append(const std::string& key, const std::string& value) override {
    guarded("append '" + key + "'",
            [&] { update(key, [&](const Seen& seen) { return seen.value + value; }); });
  }

  std::vector<std::string> multi_get(const std::vector<std::string>& keys) override {
    return guarded(keys_what("multi_get", keys), [&] {
      std::vector<json> ops;
      ops.reserve(keys.size());
      for (const auto& key : keys) ops.push_back(range_op(key));
      const std::vector<json> answers = run_ops(ops, "response_range");
      std::vector<std::string> values;
      values.reserve(keys.size());
      for (std::size_t i = 0; i < keys.size(); ++i) {
        const Seen seen = first_kv(answers[i]);
        if (!seen.exists) throw StoreError("key '" + keys[i] + "' is gone");
        values.push_back(seen.value);
      }
      return values;
    });
  }

  void multi_set(const std::vector<std::string>& keys,
                 const std::vector<std::string>& values) override {
    guarded(keys_what("multi_set", keys), [&] {
      std::vector<json> ops;
      ops.reserve(keys.size());
      for (std::size_t i = 0; i < keys.size(); ++i) ops.push_back(put_op(keys[i], values[i]));
      run_ops(ops, "response_put");
    });
  }

  int64_t num_keys() override {
    return guarded("num_keys", [&] {
      // From "\0" to the end of the key space ("\0" as range_end): every key of the cluster.
      const std::string zero(1, '\0');
      const json reply = request(
          "/v3/kv/range",
          {{"key", base64_encode(zero)}, {"range_end", base64_encode(zero)}, {"count_only", true}},
          Clock::now() + timeout_);
      return int_field(reply, "count");
    });
  }

  std::vector<std::string> list_keys(const std::string& prefix) override {
    return guarded("list_keys", [&] {
      // etcd's prefix range: from the prefix to the prefix with its last byte below 0xff
      // raised; "\0" to "\0" is every key.
      std::string end = prefix;
      while (!end.empty() && static_cast<unsigned char>(end.back()) == 0xff) end.pop_back();
      if (end.empty()) {
        end = std::string(1, '\0');
      } else {
        end.back() = static_cast<char>(static_cast<unsigned char>(end.back()) + 1);
      }
      const std::string start = prefix.empty() ? std::string(1, '\0') : prefix;
      const json reply = request("/v3/kv/range",
                                 {{"key", base64_encode(start)},
                                  {"range_end", base64_encode(end)},
                                  {"keys_only", true},
                                  {"sort_order", "ASCEND"},
                                  {"sort_target", "KEY"}},
                                 Clock::now() + timeout_);
      std::vector<std::string> keys;
      for (const json& kv : array_member(reply, "kvs")) keys.push_back(bytes_field(kv, "key"));
      return keys;
    });
  }

  const std::string& endpoint_host() const override { return host_; }
  int port() const override { return port_; }
  milliseconds timeout() const override { return timeout_; }
  // etcd speaks none of the c10d protocols; kModern, as documented in store.h.
  StoreProtocol protocol() const override { return StoreProtocol::kModern; }
  const char* name() const override { return "etcd"; }

 private:
  // Runs `fn`; a failure becomes one StoreError line naming etcd's endpoint and the operation.
  template <typename Fn>
  auto guarded(const std::string& what, Fn&& fn) -> decltype(fn()) {
    try {
      return fn();
    } catch (const StoreError& e) {
      throw StoreError("etcd at " + where_ + ": " + what + ": " + e.what());
    } catch (const json::exception& e) {
      throw StoreError("etcd at " + where_ + ": " + what + ": a malformed answer (" + e.what() +
                       ")");
    }
  }

  void give_up_at(Clock::time_point deadline) const {
    if (Clock::now() >= deadline) {
      throw StoreError("the key kept changing under this client for " + seconds(timeout_));
    }
  }

  // Read-modify-write of one key: next(seen) is the value to write over what was seen. The
  // first try guesses the key is missing; a failed comparison reads the key in the same round
  // trip, and the next try compares its mod_revision.
  template <typename Next>
  void update(const std::string& key, Next&& next) {
    const auto deadline = Clock::now() + timeout_;
    Seen seen;
    // After a lost race, a random pause of up to `spread`, doubling to 256 ms: without it, K
    // clients adding to one counter at once (every agent's join) cost etcd O(K^2) transactions,
    // and 1,024 of them never finish.
    auto spread = milliseconds(2);
    thread_local std::minstd_rand jitter(std::random_device{}());
    for (int lost = 0;; ++lost) {
      const json compare =
          seen.exists ? mod_revision_is(key, seen.mod_revision) : version_is_zero(key);
      const json reply = txn(json::array({compare}), json::array({put_op(key, next(seen))}),
                             json::array({range_op(key)}), deadline);
      if (bool_field(reply, "succeeded")) return;
      seen = first_kv(txn_answer(reply, 0, "response_range"));
      give_up_at(deadline);
      // The first loss was most likely a guess of "missing" (add and append guess it).
      if (lost == 0) continue;
      std::this_thread::sleep_for(std::min<Clock::duration>(
          milliseconds(std::uniform_int_distribution<long>(0, spread.count())(jitter)),
          deadline - Clock::now()));
      spread = std::min(spread * 2, milliseconds(256));
    }
  }

  json txn(json compare, json success, json failure, Clock::time_point deadline) {
    return request("/v3/kv/txn",
                   {{"compare", std::move(compare)},
                    {"success", std::move(success)},
                    {"failure", std::move(failure)}},
                   deadline);
  }

  // Runs `ops` in transactions of at most kMaxTxnOps each; the answers, in order, of `kind`.
  std::vector<json> run_ops(const std::vector<json>& ops, const char* kind) {
    std::vector<json> answers;
    answers.reserve(ops.size());
    for (std::size_t begin = 0; begin < ops.size(); begin += kMaxTxnOps) {
      const std::size_t end = std::min(ops.size(), begin + kMaxTxnOps);
      json success = json::array();
      for (std::size_t i = begin; i < end; ++i) success.push_back(ops[i]);
      const json reply =
          txn(json::array(), std::move(success), json::array(), Clock::now() + timeout_);
      for (std::size_t i = 0; i < end - begin; ++i) answers.push_back(txn_answer(reply, i, kind));
    }
    return answers;
  }

  bool all_exist(const std::vector<std::string>& keys, Clock::time_point deadline) {
    for (std::size_t begin = 0; begin < keys.size(); begin += kMaxTxnOps) {
      const std::size_t end = std::min(keys.size(), begin + kMaxTxnOps);
      json success = json::array();
      for (std::size_t i = begin; i < end; ++i) success.push_back(range_op(keys[i], true));
      const json reply = txn(json::array(), std::move(success), json::array(), deadline);
      for (std::size_t i = 0; i < end - begin; ++i) {
        if (int_field(txn_answer(reply, i, "response_range"), "count") == 0) return false;
      }
    }
    return true;
  }

  // One request to etcd's gateway: its answer, or a StoreError saying why there is none.
  json request(const std::string& path, const json& body, Clock::time_point deadline) {
    const HttpReply reply = http_.post(path, body.dump(), deadline);
    if (reply.code != CURLE_OK) throw StoreError(http_.transport_cause(reply));
    if (reply.status != 200) {
      const std::string message = etcd_message(reply.body);
      if (message.empty()) throw StoreError(not_etcd(reply, path));
      throw StoreError("HTTP " + std::to_string(reply.status) + ": " + message);
    }
    json answer = json::parse(reply.body, nullptr, false);
    if (!answer.is_object()) {
      throw StoreError("the answer to " + path + " is not etcd's JSON: is this etcd 3.4 or newer?");
    }
    return answer;
  }

  // An HTTP answer that is not etcd's.
  std::string not_etcd(const HttpReply& reply, const std::string& path) const {
    std::string text = "the server at " + where_ + " answered HTTP " +
                       std::to_string(reply.status) + " to " + path;
    if (!https_ && reply.body.find("HTTPS server") != std::string::npos) {
      return text + ": it speaks https; set --rdzv-conf protocol=https";
    }
    return text + ": is this etcd 3.4 or newer? check --rdzv-endpoint";
  }

  std::string host_;
  int port_ = kDefaultPort;
  milliseconds timeout_;
  std::string where_;  // host:port, an IPv6 address in brackets
  bool https_ = false;
  HttpPoster http_;
};

}  // namespace

std::optional<EtcdEndpoint> parse_etcd_endpoint(const std::string& endpoint) {
  EtcdEndpoint parsed;
  std::string_view rest = endpoint;
  const auto scheme_end = rest.find("://");
  if (scheme_end != std::string_view::npos) {
    parsed.scheme = std::string(rest.substr(0, scheme_end));
    if (parsed.scheme != "http" && parsed.scheme != "https") return std::nullopt;
    rest.remove_prefix(scheme_end + 3);
  }
  while (!rest.empty() && rest.back() == '/') rest.remove_suffix(1);
  if (rest.empty() || rest.find_first_of("/,@ ?#") != std::string_view::npos) return std::nullopt;
  std::string_view port;
  if (rest.front() == '[') {
    const auto close = rest.find(']');
    if (close == std::string_view::npos || close == 1) return std::nullopt;
    parsed.host = std::string(rest.substr(1, close - 1));
    const std::string_view after = rest.substr(close + 1);
    if (!after.empty()) {
      if (after.front() != ':') return std::nullopt;
      port = after.substr(1);
      if (port.empty()) return std::nullopt;
    }
  } else {
    const auto colon = rest.find(':');
    if (colon != std::string_view::npos && rest.find(':', colon + 1) != std::string_view::npos) {
      parsed.host = std::string(rest);  // an IPv6 address without brackets, hence without port
    } else if (colon != std::string_view::npos) {
      parsed.host = std::string(rest.substr(0, colon));
      port = rest.substr(colon + 1);
      if (parsed.host.empty() || port.empty()) return std::nullopt;
    } else {
      parsed.host = std::string(rest);
    }
  }
  if (!port.empty()) {
    int value = 0;
    const auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
    if (ec != std::errc() || end != port.data() + port.size() || value < 1 || value > 65535) {
      return std::nullopt;
    }
    parsed.port = value;
  }
  return parsed;
}

std::shared_ptr<StoreBackend> connect_etcd(const EtcdOptions& options, milliseconds connect_timeout,
                                           milliseconds request_timeout) {
  auto endpoint = parse_etcd_endpoint(options.endpoint);
  if (!endpoint) {
    throw ConfigError("etcd endpoint '" + options.endpoint +
                      "' is not HOST[:PORT] or http(s)://HOST[:PORT]; check --rdzv-endpoint");
  }
  if (endpoint->scheme.empty()) {
    if (options.protocol != "http" && options.protocol != "https") {
      throw ConfigError("etcd protocol '" + options.protocol +
                        "' is neither http nor https; check --rdzv-conf protocol");
    }
    endpoint->scheme = options.protocol;
  }
  if (endpoint->scheme == "https") {
    const std::pair<const char*, const std::string*> files[] = {
        {"cacert", &options.cacert}, {"cert", &options.cert}, {"key", &options.key}};
    for (const auto& [name, path] : files) {
      std::string why;
      if (!path->empty() && !readable(*path, why)) {
        throw ConfigError(std::string("cannot read etcd's ") + name + " file '" + *path + "' (" +
                          why + "); check --rdzv-conf " + name);
      }
    }
  } else if (!options.cacert.empty() || !options.cert.empty() || !options.key.empty()) {
    log::warn("etcd at {} is reached over http: the cacert, cert and key given are not used",
              options.endpoint);
  }
  auto backend = std::make_shared<EtcdBackend>(*endpoint, options, request_timeout);
  backend->connect(connect_timeout);
  return backend;
}

}  // namespace ddp::detail
