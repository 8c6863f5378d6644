#include "store/etcd_backend.h"

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

// Types and constants only: the functions are resolved with dlsym (see CurlApi).
#define CURL_DISABLE_TYPECHECK 1
#include <curl/curl.h>
#include <nlohmann/json.hpp>

#include "ddp/error.h"
#include "ddp/log.h"

namespace ddp::detail {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using json = nlohmann::json;

// etcd's default --max-txn-ops: a transaction of more operations is refused.
constexpr std::size_t kMaxTxnOps = 128;
constexpr int kDefaultPort = 2379;

std::string seconds(milliseconds t) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f s", static_cast<double>(t.count()) / 1000.0);
  return text;
}

long millis_until(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count();
  return static_cast<long>(std::clamp<long long>(left, 1, 24LL * 3600 * 1000));
}

// ---- libcurl, loaded at run time ----------------------------------------------------------

struct CurlApi {
  CURLcode (*global_init)(long) = nullptr;
  CURL* (*easy_init)() = nullptr;
  CURLcode (*easy_setopt)(CURL*, CURLoption, ...) = nullptr;
  CURLcode (*easy_perform)(CURL*) = nullptr;
  CURLcode (*easy_getinfo)(CURL*, CURLINFO, ...) = nullptr;
  void (*easy_cleanup)(CURL*) = nullptr;
  const char* (*easy_strerror)(CURLcode) = nullptr;
  curl_slist* (*slist_append)(curl_slist*, const char*) = nullptr;
  void (*slist_free_all)(curl_slist*) = nullptr;
};

// libcurl's functions, resolved once (the library stays loaded for the life of the process);
// throws a StoreError that says how to install it when this host lacks it.
const CurlApi& curl_api() {
  static std::once_flag once;
  static CurlApi api;
  static std::string failure;
  std::call_once(once, [] {
    void* lib = dlopen("libcurl.so.4", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      failure =
          "--rdzv-backend etcd-v2 needs libcurl (libcurl.so.4), which this host lacks: install it "
          "(Debian: libcurl4)";
      return;
    }
    CurlApi found;
    std::string missing;
    const auto resolve = [&](auto& fn, const char* name) {
      void* symbol = dlsym(lib, name);
      if (symbol == nullptr && missing.empty()) missing = name;
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(symbol);
    };
    resolve(found.global_init, "curl_global_init");
    resolve(found.easy_init, "curl_easy_init");
    resolve(found.easy_setopt, "curl_easy_setopt");
    resolve(found.easy_perform, "curl_easy_perform");
    resolve(found.easy_getinfo, "curl_easy_getinfo");
    resolve(found.easy_cleanup, "curl_easy_cleanup");
    resolve(found.easy_strerror, "curl_easy_strerror");
    resolve(found.slist_append, "curl_slist_append");
    resolve(found.slist_free_all, "curl_slist_free_all");
    if (!missing.empty()) {
      failure = "the libcurl.so.4 on this host lacks " + missing +
                ": install a libcurl 7.x or newer (Debian: libcurl4)";
      return;
    }
    const CURLcode init = found.global_init(CURL_GLOBAL_DEFAULT);
    if (init != CURLE_OK) {
      failure = std::string("libcurl failed to initialise: ") + found.easy_strerror(init);
      return;
    }
    api = found;
  });
  if (!failure.empty()) throw StoreError(failure);
  return api;
}

size_t append_to_string(char* data, size_t size, size_t count, void* out) {
  static_cast<std::string*>(out)->append(data, size * count);
  return size * count;
}

// ---- JSON -------------------------------------------------------------------------------------

// A 64-bit integer field: a JSON string in etcd's answers ("7"), a number accepted too; absent
// means 0.
int64_t int_field(const json& object, const char* name) {
  const auto it = object.find(name);
  if (it == object.end() || it->is_null()) return 0;
  if (it->is_number_integer()) return it->get<int64_t>();
  if (it->is_string()) {
    const auto& text = it->get_ref<const std::string&>();
    int64_t value = 0;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (ec == std::errc() && end == text.data() + text.size()) return value;
  }
  throw StoreError(std::string("etcd answered a malformed '") + name + "': " + it->dump());
}

bool bool_field(const json& object, const char* name) {
  const auto it = object.find(name);
  return it != object.end() && it->is_boolean() && it->get<bool>();
}

// A bytes field (base64); absent means empty.
std::string bytes_field(const json& object, const char* name) {
  const auto it = object.find(name);
  if (it == object.end() || it->is_null()) return "";
  if (it->is_string()) {
    if (auto bytes = base64_decode(it->get_ref<const std::string&>())) return *bytes;
  }
  throw StoreError(std::string("etcd answered a malformed '") + name + "'");
}

const json& member(const json& object, const char* name) {
  static const json empty = json::object();
  const auto it = object.find(name);
  return it == object.end() || !it->is_object() ? empty : *it;
}

const json& array_member(const json& object, const char* name) {
  static const json empty = json::array();
  const auto it = object.find(name);
  return it == object.end() || !it->is_array() ? empty : *it;
}

// The first key-value of a range's answer.
struct Seen {
  bool exists = false;
  std::string value;
  int64_t mod_revision = 0;
};

Seen first_kv(const json& range_answer) {
  const json& kvs = array_member(range_answer, "kvs");
  Seen seen;
  if (kvs.empty()) return seen;
  seen.exists = true;
  seen.value = bytes_field(kvs.front(), "value");
  seen.mod_revision = int_field(kvs.front(), "mod_revision");
  return seen;
}

json put_op(const std::string& key, const std::string& value) {
  return {{"request_put", {{"key", base64_encode(key)}, {"value", base64_encode(value)}}}};
}

json range_op(const std::string& key, bool count_only = false) {
  json range = {{"key", base64_encode(key)}};
  if (count_only) range["count_only"] = true;
  return {{"request_range", std::move(range)}};
}

json version_is_zero(const std::string& key) {
  return {
      {"target", "VERSION"}, {"key", base64_encode(key)}, {"result", "EQUAL"}, {"version", "0"}};
}

json mod_revision_is(const std::string& key, int64_t revision) {
  return {{"target", "MOD"},
          {"key", base64_encode(key)},
          {"result", "EQUAL"},
          {"mod_revision", std::to_string(revision)}};
}

json value_is(const std::string& key, const std::string& value) {
  return {{"target", "VALUE"},
          {"key", base64_encode(key)},
          {"result", "EQUAL"},
          {"value", base64_encode(value)}};
}

// The n-th answer of a transaction, of the given kind ("response_range", "response_put").
const json& txn_answer(const json& reply, std::size_t n, const char* kind) {
  const json& answers = array_member(reply, "responses");
  if (n >= answers.size()) {
    throw StoreError("etcd answered " + std::to_string(answers.size()) +
                     " results to a transaction that expects more");
  }
  return member(answers[n], kind);
}

// "describe 3 key(s) starting 'k'".
std::string keys_what(const char* op, const std::vector<std::string>& keys) {
  return std::string(op) + " " + std::to_string(keys.size()) + " key(s) starting '" +
         (keys.empty() ? std::string() : keys.front()) + "'";
}

// torch's std::stoll on a counter: a leading integer is enough ("5x" counts as 5).
int64_t counter_value(const std::string& value) {
  errno = 0;
  char* end = nullptr;
  const long long current = std::strtoll(value.c_str(), &end, 10);
  if (end == value.c_str() || errno != 0) {
    throw StoreError("its value '" + value + "' is not an integer");
  }
  return static_cast<int64_t>(current);
}

bool readable(const std::string& path, std::string& why) {
  if (access(path.c_str(), R_OK) == 0) return true;
  why = std::strerror(errno);
  return false;
}

// ---- the backend ------------------------------------------------------------------------------

// One transfer's outcome, before any judgement.
struct Reply {
  CURLcode code = CURLE_OK;
  long status = 0;
  long os_errno = 0;
  std::string error;  // libcurl's message for a failed transfer
  std::string body;
};

class EtcdBackend final : public StoreBackend {
 public:
  EtcdBackend(const EtcdEndpoint& endpoint, const EtcdOptions& options, milliseconds timeout)
      : api_(curl_api()), host_(endpoint.host), port_(endpoint.port), timeout_(timeout) {
    const bool v6 = host_.find(':') != std::string::npos;
    where_ = (v6 ? "[" + host_ + "]" : host_) + ":" + std::to_string(port_);
    https_ = endpoint.scheme == "https";
    base_url_ = endpoint.scheme + "://" + where_;
    handle_ = api_.easy_init();
    if (handle_ == nullptr) throw StoreError("libcurl could not create a transfer handle");
    headers_ = api_.slist_append(headers_, "Content-Type: application/json");
    // No "Expect: 100-continue" round trip before a large body.
    headers_ = api_.slist_append(headers_, "Expect:");
    api_.easy_setopt(handle_, CURLOPT_NOSIGNAL, 1L);
    api_.easy_setopt(handle_, CURLOPT_POST, 1L);
    api_.easy_setopt(handle_, CURLOPT_HTTPHEADER, headers_);
    api_.easy_setopt(handle_, CURLOPT_HTTP_VERSION, static_cast<long>(CURL_HTTP_VERSION_1_1));
    api_.easy_setopt(handle_, CURLOPT_WRITEFUNCTION, &append_to_string);
    api_.easy_setopt(handle_, CURLOPT_WRITEDATA, &response_);
    api_.easy_setopt(handle_, CURLOPT_ERRORBUFFER, error_.data());
    api_.easy_setopt(handle_, CURLOPT_TCP_KEEPALIVE, 1L);
    // etcd is reached directly: an http_proxy meant for the outside world must not carry it.
    api_.easy_setopt(handle_, CURLOPT_PROXY, "");
    if (https_) {
      if (!options.cacert.empty())
        api_.easy_setopt(handle_, CURLOPT_CAINFO, options.cacert.c_str());
      if (!options.cert.empty()) api_.easy_setopt(handle_, CURLOPT_SSLCERT, options.cert.c_str());
      if (!options.key.empty()) api_.easy_setopt(handle_, CURLOPT_SSLKEY, options.key.c_str());
    }
  }

  ~EtcdBackend() override {
    if (handle_ != nullptr) api_.easy_cleanup(handle_);
    if (headers_ != nullptr) api_.slist_free_all(headers_);
  }

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
      const Reply reply = post(path, body, deadline);
      std::string cause;
      bool retry = false;
      if (reply.code != CURLE_OK) {
        cause = transport_cause(reply);
        retry = retryable(reply.code);
        if (!retry) {
          throw StoreError("cannot reach etcd at " + where_ + " (" + cause + "); " +
                           (tls_failure(reply.code)
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
        return seen.exists ? counter_value(seen.value) : int64_t{0};
      }
      int64_t result = 0;
      update(key, [&](const Seen& seen) {
        const int64_t current = seen.exists ? counter_value(seen.value) : 0;
        result =
            static_cast<int64_t>(static_cast<uint64_t>(current) + static_cast<uint64_t>(delta));
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
        // The c10d store: an empty `expected` matches a missing key or an empty value.
        const bool matches = seen.exists ? seen.value == expected : expected.empty();
        // torch answers `expected` for a missing key, else the current value.
        if (!matches) return seen.exists ? seen.value : expected;
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
    const Reply reply = post(path, body.dump(), deadline);
    if (reply.code != CURLE_OK) throw StoreError(transport_cause(reply));
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

  Reply post(const std::string& path, const std::string& body, Clock::time_point deadline) {
    std::lock_guard<std::mutex> lock(mu_);
    const long left = millis_until(deadline);
    const std::string url = base_url_ + path;
    api_.easy_setopt(handle_, CURLOPT_URL, url.c_str());
    api_.easy_setopt(handle_, CURLOPT_POSTFIELDS, body.c_str());
    api_.easy_setopt(handle_, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.size()));
    api_.easy_setopt(handle_, CURLOPT_TIMEOUT_MS, left);
    api_.easy_setopt(handle_, CURLOPT_CONNECTTIMEOUT_MS, left);
    response_.clear();
    error_[0] = '\0';
    Reply reply;
    reply.code = api_.easy_perform(handle_);
    api_.easy_getinfo(handle_, CURLINFO_RESPONSE_CODE, &reply.status);
    if (reply.code != CURLE_OK) {
      api_.easy_getinfo(handle_, CURLINFO_OS_ERRNO, &reply.os_errno);
      reply.error = error_.data();
    }
    reply.body = std::move(response_);
    response_.clear();
    return reply;
  }

  // Why a transfer failed, in a few words ("connection refused").
  std::string transport_cause(const Reply& reply) const {
    if (reply.code == CURLE_COULDNT_CONNECT && reply.os_errno != 0) {
      std::string text = std::strerror(static_cast<int>(reply.os_errno));
      if (!text.empty())
        text[0] = static_cast<char>(std::tolower(static_cast<unsigned char>(text[0])));
      return text;
    }
    if (!reply.error.empty()) {
      std::string text = reply.error;
      while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back())))
        text.pop_back();
      if (!text.empty()) return text;
    }
    return api_.easy_strerror(reply.code);
  }

  // Failures that waiting may cure: nothing listens yet, its name does not resolve yet, or it
  // does not answer yet.
  static bool retryable(CURLcode code) {
    return code == CURLE_COULDNT_CONNECT || code == CURLE_COULDNT_RESOLVE_HOST ||
           code == CURLE_OPERATION_TIMEDOUT || code == CURLE_GOT_NOTHING ||
           code == CURLE_RECV_ERROR || code == CURLE_SEND_ERROR;
  }

  static bool tls_failure(CURLcode code) {
    return code == CURLE_SSL_CONNECT_ERROR || code == CURLE_PEER_FAILED_VERIFICATION ||
           code == CURLE_SSL_CERTPROBLEM || code == CURLE_SSL_CIPHER ||
           code == CURLE_SSL_CACERT_BADFILE || code == CURLE_SSL_ENGINE_NOTFOUND ||
           code == CURLE_SSL_ENGINE_SETFAILED || code == CURLE_USE_SSL_FAILED;
  }

  // etcd's error text from its gateway's answer ({"error": ..., "message": ..., "code": N}), or
  // "" when the answer is not of that form.
  static std::string etcd_message(const std::string& body) {
    const json answer = json::parse(body, nullptr, false);
    if (!answer.is_object()) return "";
    for (const char* name : {"message", "error"}) {
      const auto it = answer.find(name);
      if (it != answer.end() && it->is_string() && !it->get_ref<const std::string&>().empty()) {
        return it->get<std::string>();
      }
    }
    return "";
  }

  // An HTTP answer that is not etcd's.
  std::string not_etcd(const Reply& reply, const std::string& path) const {
    std::string text = "the server at " + where_ + " answered HTTP " +
                       std::to_string(reply.status) + " to " + path;
    if (!https_ && reply.body.find("HTTPS server") != std::string::npos) {
      return text + ": it speaks https; set --rdzv-conf protocol=https";
    }
    return text + ": is this etcd 3.4 or newer? check --rdzv-endpoint";
  }

  const CurlApi& api_;
  std::string host_;
  int port_ = kDefaultPort;
  milliseconds timeout_;
  std::string where_;  // host:port, an IPv6 address in brackets
  std::string base_url_;
  bool https_ = false;
  std::mutex mu_;  // guards the handle and what it writes into
  CURL* handle_ = nullptr;
  curl_slist* headers_ = nullptr;
  std::string response_;
  std::array<char, CURL_ERROR_SIZE + 1> error_{};
};

}  // namespace

std::string base64_encode(std::string_view bytes) {
  static constexpr char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  std::size_t i = 0;
  for (; i + 3 <= bytes.size(); i += 3) {
    const uint32_t n = static_cast<uint32_t>(static_cast<unsigned char>(bytes[i])) << 16 |
                       static_cast<uint32_t>(static_cast<unsigned char>(bytes[i + 1])) << 8 |
                       static_cast<uint32_t>(static_cast<unsigned char>(bytes[i + 2]));
    out += kAlphabet[(n >> 18) & 63];
    out += kAlphabet[(n >> 12) & 63];
    out += kAlphabet[(n >> 6) & 63];
    out += kAlphabet[n & 63];
  }
  const std::size_t rest = bytes.size() - i;
  if (rest > 0) {
    uint32_t n = static_cast<uint32_t>(static_cast<unsigned char>(bytes[i])) << 16;
    if (rest == 2) n |= static_cast<uint32_t>(static_cast<unsigned char>(bytes[i + 1])) << 8;
    out += kAlphabet[(n >> 18) & 63];
    out += kAlphabet[(n >> 12) & 63];
    out += rest == 2 ? kAlphabet[(n >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

std::optional<std::string> base64_decode(std::string_view text) {
  const auto digit = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  if (text.size() % 4 != 0) return std::nullopt;
  std::string out;
  out.reserve(text.size() / 4 * 3);
  for (std::size_t i = 0; i < text.size(); i += 4) {
    const bool last = i + 4 == text.size();
    // Padding: only in the last group, as its last one or two characters.
    const int padding =
        last ? (text[i + 3] == '=') + (text[i + 2] == '=' && text[i + 3] == '=') : 0;
    uint32_t n = 0;
    for (std::size_t j = 0; j < 4; ++j) {
      int d = 0;
      if (j < 4 - static_cast<std::size_t>(padding)) {
        d = digit(text[i + j]);
        if (d < 0) return std::nullopt;
      }
      n = n << 6 | static_cast<uint32_t>(d);
    }
    out += static_cast<char>((n >> 16) & 0xFF);
    if (padding < 2) out += static_cast<char>((n >> 8) & 0xFF);
    if (padding < 1) out += static_cast<char>(n & 0xFF);
  }
  return out;
}

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
