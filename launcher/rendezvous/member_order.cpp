#include "rendezvous/member_order.h"

#include <algorithm>
#include <climits>
#include <cstddef>
#include <tuple>

namespace ddprun {
namespace {

bool is_digit(char c) { return c >= '0' && c <= '9'; }

// The run of digits starting at `i`, without its leading zeros; `i` moves past the run.
std::string_view digit_run(std::string_view s, std::size_t& i) {
  const std::size_t start = i;
  while (i < s.size() && is_digit(s[i])) ++i;
  std::string_view run = s.substr(start, i - start);
  while (run.size() > 1 && run.front() == '0') run.remove_prefix(1);
  return run;
}

}  // namespace

bool natural_less(std::string_view a, std::string_view b) {
  std::size_t i = 0;
  std::size_t j = 0;
  while (i < a.size() && j < b.size()) {
    if (is_digit(a[i]) && is_digit(b[j])) {
      const std::string_view x = digit_run(a, i);
      const std::string_view y = digit_run(b, j);
      if (x.size() != y.size()) return x.size() < y.size();
      if (x != y) return x < y;
      continue;
    }
    if (a[i] != b[j]) return a[i] < b[j];
    ++i;
    ++j;
  }
  if (a.size() - i != b.size() - j) return a.size() - i < b.size() - j;
  return a < b;  // equal by value ("pod-02" and "pod-2"): any fixed order
}

void order_members(std::vector<RoundMember>& members) {
  const auto rank_key = [](const RoundMember& m) {
    return m.node_rank >= 0 ? m.node_rank : INT_MAX;
  };
  const auto pref_key = [](const RoundMember& m) {
    return m.preferred >= 0 ? m.preferred : INT_MAX;
  };
  std::stable_sort(members.begin(), members.end(), [&](const RoundMember& a, const RoundMember& b) {
    if (rank_key(a) != rank_key(b)) return rank_key(a) < rank_key(b);
    if (pref_key(a) != pref_key(b)) return pref_key(a) < pref_key(b);
    if (a.host != b.host) return natural_less(a.host, b.host);
    return a.join_index < b.join_index;
  });
}

}  // namespace ddprun
