#pragma once
// The JSON of etcd's v3 gateway, for the etcd backend: bytes as standard base64, 64-bit integers
// as JSON strings, absent fields 0, false or empty; the request ops and comparisons its
// transactions are made of, and the fields read from its answers. Every malformed answer is a
// StoreError.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace ddp::detail {

using json = nlohmann::json;

// Standard base64 (RFC 4648, with padding), as etcd's JSON gateway writes bytes.
std::string base64_encode(std::string_view bytes);
// nullopt when `text` is not base64 of that form (a wrong character, length or padding).
std::optional<std::string> base64_decode(std::string_view text);

// ---- Reading answers ----
// A 64-bit integer field: a JSON string in etcd's answers ("7"), a number accepted too; absent
// means 0.
int64_t int_field(const json& object, const char* name);
bool bool_field(const json& object, const char* name);
// A bytes field (base64); absent means empty.
std::string bytes_field(const json& object, const char* name);
// An object or array member; an empty one when absent or of another type.
const json& member(const json& object, const char* name);
const json& array_member(const json& object, const char* name);

// The first key-value of a range's answer.
struct Seen {
  bool exists = false;
  std::string value;
  int64_t mod_revision = 0;
};
Seen first_kv(const json& range_answer);

// The n-th answer of a transaction, of the given kind ("response_range", "response_put").
const json& txn_answer(const json& reply, std::size_t n, const char* kind);

// etcd's error text from its gateway's answer ({"error": ..., "message": ..., "code": N}), or
// "" when the answer is not of that form.
std::string etcd_message(const std::string& body);

// ---- Writing requests ----
json put_op(const std::string& key, const std::string& value);
json range_op(const std::string& key, bool count_only = false);
// Comparisons: the key is missing; it was last written at `revision`; it holds `value`.
json version_is_zero(const std::string& key);
json mod_revision_is(const std::string& key, int64_t revision);
json value_is(const std::string& key, const std::string& value);

}  // namespace ddp::detail
