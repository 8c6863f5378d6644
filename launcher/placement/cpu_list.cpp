#include "placement/cpu_list.h"

#include <cctype>
#include <sstream>

#include "ddp/error.h"

namespace ddprun {
namespace {

constexpr long kMaxCpu = 65535;

std::string trimmed(const std::string& text) {
  const auto first = text.find_first_not_of(" \t\r\n");
  if (first == std::string::npos) return "";
  const auto last = text.find_last_not_of(" \t\r\n");
  return text.substr(first, last - first + 1);
}

// One CPU number of `item`; throws naming the whole list.
int cpu_number(const std::string& digits, const std::string& item, const std::string& text,
               const std::string& what) {
  bool ok = !digits.empty() && digits.size() <= 6;
  for (char c : digits) ok = ok && std::isdigit(static_cast<unsigned char>(c)) != 0;
  const long value = ok ? std::stol(digits) : -1;
  if (value < 0 || value > kMaxCpu) {
    throw ddp::Error(what + ": '" + trimmed(text) + "' is not a CPU list ('" + item +
                     "': expected N or N-M with CPU numbers up to " + std::to_string(kMaxCpu) +
                     ", as in 0-3,8,10-11)");
  }
  return static_cast<int>(value);
}

}  // namespace

std::set<int> parse_cpu_list(const std::string& text, const std::string& what) {
  std::set<int> cpus;
  std::istringstream items(text);
  std::string raw;
  while (std::getline(items, raw, ',')) {
    const std::string item = trimmed(raw);
    if (item.empty()) continue;
    const auto dash = item.find('-');
    if (dash == std::string::npos) {
      cpus.insert(cpu_number(item, item, text, what));
      continue;
    }
    const int first = cpu_number(item.substr(0, dash), item, text, what);
    const int last = cpu_number(item.substr(dash + 1), item, text, what);
    if (last < first) {
      throw ddp::Error(what + ": '" + trimmed(text) + "' is not a CPU list ('" + item +
                       "' runs backwards; write the lower CPU first)");
    }
    for (int cpu = first; cpu <= last; ++cpu) cpus.insert(cpu);
  }
  return cpus;
}

std::string format_cpu_list(const std::set<int>& cpus) {
  std::string text;
  for (auto it = cpus.begin(); it != cpus.end();) {
    const int first = *it;
    int last = first;
    for (++it; it != cpus.end() && *it == last + 1; ++it) last = *it;
    if (!text.empty()) text += ',';
    text += std::to_string(first);
    if (last != first) text += "-" + std::to_string(last);
  }
  return text;
}

}  // namespace ddprun
