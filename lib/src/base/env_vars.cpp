#include "ddp/env_vars.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <mutex>

#include "ddp/error.h"

namespace ddp::env {
namespace {

struct Overrides {
  std::mutex mu;
  std::map<std::string, std::string> values;
};

Overrides& overrides() {
  static Overrides* o = new Overrides();  // never destroyed: read by threads that outlive statics
  return *o;
}

}  // namespace

void set_overrides(std::map<std::string, std::string> values) {
  Overrides& o = overrides();
  std::lock_guard<std::mutex> lock(o.mu);
  o.values = std::move(values);
}

std::optional<std::string> get(const char* name) {
  {
    Overrides& o = overrides();
    std::lock_guard<std::mutex> lock(o.mu);
    if (auto it = o.values.find(name); it != o.values.end()) {
      if (it->second.empty()) return std::nullopt;
      return it->second;
    }
  }
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return std::nullopt;
  return std::string(value);
}

long parse_int(const std::string& what, const std::string& text, long min_value, long max_value) {
  errno = 0;
  char* end = nullptr;
  const long value = std::strtol(text.c_str(), &end, 10);
  const bool whole = end != text.c_str() && *end == '\0';
  if (!whole || errno == ERANGE) {
    throw ConfigError(what + "='" + text + "' is not an integer; set it to a whole number in [" +
                      std::to_string(min_value) + ", " + std::to_string(max_value) + "]");
  }
  if (value < min_value || value > max_value) {
    throw ConfigError(what + "=" + text + " is out of range; expected a value in [" +
                      std::to_string(min_value) + ", " + std::to_string(max_value) + "]");
  }
  return value;
}

bool parse_bool(const std::string& what, const std::string& text) {
  std::string lower = text;
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (lower == "1" || lower == "true" || lower == "yes" || lower == "on") return true;
  if (lower == "0" || lower == "false" || lower == "no" || lower == "off") return false;
  throw ConfigError(what + "='" + text +
                    "' is not a boolean; use 1/0, true/false, yes/no or on/off");
}

void unknown_choice(const char* name, const std::string& value,
                    const std::vector<std::string>& spellings) {
  std::string accepted;
  for (std::size_t i = 0; i < spellings.size(); ++i) {
    if (i > 0) accepted += i + 1 == spellings.size() ? " or " : ", ";
    accepted += spellings[i];
  }
  throw ConfigError(std::string(name) + "='" + value + "' is not known; use " + accepted);
}

std::optional<long> get_int(const char* name, long min_value, long max_value) {
  auto text = get(name);
  if (!text) return std::nullopt;
  return parse_int(name, *text, min_value, max_value);
}

std::optional<bool> get_bool(const char* name) {
  auto text = get(name);
  if (!text) return std::nullopt;
  return parse_bool(name, *text);
}

}  // namespace ddp::env
