#include "store/c10d.h"

#include <cerrno>
#include <cstdlib>

namespace ddp::store {

std::optional<int64_t> counter_value(const std::string& value) {
  errno = 0;
  char* end = nullptr;
  const long long current = std::strtoll(value.c_str(), &end, 10);
  if (end == value.c_str() || errno != 0) return std::nullopt;
  return static_cast<int64_t>(current);
}

std::optional<int64_t> counter_after_add(const std::string* current, int64_t delta) {
  int64_t base = 0;
  if (current != nullptr) {
    const auto value = counter_value(*current);
    if (!value) return std::nullopt;
    base = *value;
  }
  return static_cast<int64_t>(static_cast<uint64_t>(base) + static_cast<uint64_t>(delta));
}

CompareSetOutcome compare_set(const std::string* current, std::string_view expected,
                              std::string_view desired) {
  const bool matches = current == nullptr ? expected.empty() : *current == expected;
  if (matches) return {true, desired};
  return {false, current == nullptr ? expected : std::string_view(*current)};
}

}  // namespace ddp::store
