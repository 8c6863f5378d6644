#include "store/etcd_json.h"

#include <charconv>
#include <cstdint>
#include <utility>

#include "ddp/error.h"

namespace ddp::detail {

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

json range_op(const std::string& key, bool count_only) {
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

const json& txn_answer(const json& reply, std::size_t n, const char* kind) {
  const json& answers = array_member(reply, "responses");
  if (n >= answers.size()) {
    throw StoreError("etcd answered " + std::to_string(answers.size()) +
                     " results to a transaction that expects more");
  }
  return member(answers[n], kind);
}

std::string etcd_message(const std::string& body) {
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

}  // namespace ddp::detail
