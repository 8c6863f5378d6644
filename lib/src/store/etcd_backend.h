#pragma once
// The store backend that keeps its keys in etcd, through the JSON gateway of etcd's v3 API
// (etcd 3.4 or newer: HTTP/1.1 POSTs of JSON to /v3/kv/range, /v3/kv/put, /v3/kv/deleterange and
// /v3/kv/txn; keys and values base64, 64-bit integers as JSON strings, absent fields 0, false or
// empty).
//
// libcurl is loaded at run time (etcd_curl.h); the JSON is etcd_json.h's.
//
// How the operations map onto etcd, on full keys:
//   set: a put; get: a range of the key; remove: a deleterange.
//   add, append: a transaction that compares the key's mod_revision with the one last seen (or
//     its version with 0 while it is missing) and puts the new value; when the comparison
//     fails, the transaction's other branch reads the key, and the next try uses that (one round
//     trip per try). Counters are decimal ASCII, as in the c10d store.
//   compare_set: one transaction: value == expected (version == 0 for an empty `expected`) ->
//     put, else read the key; the answer is the c10d store's.
//   check, multi_get, multi_set: transactions of one range or put per key, at most 128 of them
//     each (etcd's default --max-txn-ops); a multi_set of more keys is not atomic.
//   wait: polls check() every 5 ms, backing off to 100 ms. (A wait on etcd's watch API, which
//     the JSON gateway streams, would answer sooner with fewer requests: future work.)
//   num_keys: a count of every key in etcd (the range from "\0" to the end of the key space).
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "ddp/store.h"
#include "store/store_backend.h"

namespace ddp::detail {

// Connects to etcd: one request that must succeed within `connect_timeout`, retried with a
// backoff from 50 ms to 1 s while the connection is refused or not answered. Each later request
// gives up after `request_timeout`. Throws a ConfigError for options that cannot work, else a
// StoreError of one line that names the endpoint, the cause and the fix.
std::shared_ptr<StoreBackend> connect_etcd(const EtcdOptions& options,
                                           std::chrono::milliseconds connect_timeout,
                                           std::chrono::milliseconds request_timeout);

// Where an endpoint ("host:port", "[v6]:port", "http(s)://host:port[/]") points; port 2379
// when none is given, scheme empty when none is. nullopt when it is not of that form.
struct EtcdEndpoint {
  std::string scheme;
  std::string host;  // without brackets
  int port = 2379;
};
std::optional<EtcdEndpoint> parse_etcd_endpoint(const std::string& endpoint);

}  // namespace ddp::detail
