#pragma once
// The c10d store's semantics for the queries whose answer depends on what a key holds, written
// once for every place that keeps keys: the server (server_queries.cpp) and the etcd backend
// (etcd_backend.cpp), so that both answer as torch's TCPStore does.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace ddp::store {

// A counter's value as torch's std::stoll reads it: a leading decimal integer is enough ("5x"
// counts as 5); nullopt for a value that does not start with one, or one out of int64's range.
std::optional<int64_t> counter_value(const std::string& value);

// ADD: the key's new value, `current` (nullopt: the key is missing, which counts as 0) plus
// `delta`, wrapping around as torch's int64 arithmetic does. nullopt when `current` is not a
// counter (see counter_value).
std::optional<int64_t> counter_after_add(const std::string* current, int64_t delta);

// COMPARE_SET on a key holding `current` (nullptr: missing). An empty `expected` matches a
// missing key or an empty value; then `desired` is written and is the answer. Otherwise nothing
// is written, and the answer is `expected` for a missing key, else the current value.
struct CompareSetOutcome {
  bool write = false;
  std::string_view answer;  // points into `current`, `expected` or `desired`
};
CompareSetOutcome compare_set(const std::string* current, std::string_view expected,
                              std::string_view desired);

}  // namespace ddp::store
