#pragma once
// Typed, validated reads of environment variables. Malformed values throw ConfigError naming the
// variable, the value found and what was expected, so a wrong pod spec fails in one clear line.
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace ddp::env {

// The value, or nullopt when the variable is unset or empty. An override (set_overrides) wins
// over the process environment.
std::optional<std::string> get(const char* name);

// Values that every later get() returns instead of the process environment's: the new place of
// a worker that regrouped in-process (ddp/distributed.h), whose launcher cannot change its
// environment. Replaces the earlier overrides; thread-safe, unlike setenv.
void set_overrides(std::map<std::string, std::string> values);

// Parses a decimal integer in [min_value, max_value]; nullopt when unset.
std::optional<long> get_int(const char* name, long min_value, long max_value);

// Parses 1/0, true/false, yes/no, on/off (any case); nullopt when unset.
std::optional<bool> get_bool(const char* name);

// Throws the ConfigError of a value outside its choices (settings::spelling):
// `name`='value' is not known; use a, b or c.
[[noreturn]] void unknown_choice(const char* name, const std::string& value,
                                 const std::vector<std::string>& spellings);

// The same parsers, for values that come from somewhere else (a flag), named by `what`.
long parse_int(const std::string& what, const std::string& text, long min_value, long max_value);
bool parse_bool(const std::string& what, const std::string& text);

}  // namespace ddp::env
