#pragma once
// The kernel's CPU list format ("0-3,8,10-11"), as sysfs and cgroups write it, both ways.
#include <set>
#include <string>

namespace ddprun {

// "0-3,8,10-11\n" -> {0, 1, 2, 3, 8, 10, 11}; "" (or only whitespace) -> {}. Empty items are
// skipped. Throws ddp::Error naming `what` (a file, a flag) for anything else: a reversed range
// ("3-1"), a missing bound ("4-"), a non-number, or a CPU number above 65535.
std::set<int> parse_cpu_list(const std::string& text, const std::string& what);

// {0, 1, 2, 3, 8, 10, 11} -> "0-3,8,10-11"; {} -> "".
std::string format_cpu_list(const std::set<int>& cpus);

}  // namespace ddprun
