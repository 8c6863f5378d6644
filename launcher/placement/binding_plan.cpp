#include "placement/binding_plan.h"

#include <algorithm>
#include <map>
#include <tuple>
#include <utility>

#include "ddp/error.h"
#include "placement/cpu_list.h"

namespace ddprun {
namespace {

// A set of usable CPUs that ranks are bound to whole (node, socket, L3 domain).
struct Domain {
  std::string label;
  std::set<int> cpus;
};

// The domains of a shared-set policy that hold usable CPUs, in order: NUMA nodes and packages
// by number, L3 domains by their lowest CPU ("L3 k" counts every L3 of the machine, usable or
// not, so the label does not change with the cpuset). A CPU whose L3 sysfs does not list falls
// back to its package.
std::vector<Domain> shared_domains(const CpuTopology& topology, BindingPolicy policy) {
  std::map<int, int> l3_index;
  for (const auto& cpu : topology.cpus) {
    if (cpu.l3 >= 0) l3_index.emplace(cpu.l3, 0);
  }
  int next = 0;
  for (auto& entry : l3_index) entry.second = next++;
  std::map<std::pair<int, int>, Domain> by_key;
  for (int id : topology.usable) {
    const CpuInfo* cpu = topology.find(id);
    if (cpu == nullptr) continue;
    std::pair<int, int> key{1, cpu->package};
    std::string label = "socket " + std::to_string(cpu->package);
    if (policy == BindingPolicy::kNode) {
      key = {0, cpu->node};
      label = "node " + std::to_string(cpu->node);
    } else if (policy == BindingPolicy::kCoreComplex && cpu->l3 >= 0) {
      key = {0, l3_index.at(cpu->l3)};
      label = "L3 " + std::to_string(key.second);
    }
    Domain& domain = by_key[key];
    domain.label = label;
    domain.cpus.insert(id);
  }
  std::vector<Domain> domains;
  for (auto& entry : by_key) domains.push_back(std::move(entry.second));
  return domains;
}

// node, socket, core-complex: rank r on domain r*D/n, so ranks fill the domains in contiguous
// blocks as even as they can be (fewer ranks than domains: spread evenly over them); ranks of
// one domain share its CPUs and split its cores' worth of threads.
std::vector<RankPlacement> plan_shared(const CpuTopology& topology, int nproc,
                                       BindingPolicy policy) {
  const std::vector<Domain> domains = shared_domains(topology, policy);
  const auto count = static_cast<long>(domains.size());
  std::vector<int> sharers(domains.size(), 0);
  for (long r = 0; r < nproc; ++r) ++sharers[static_cast<std::size_t>(r * count / nproc)];
  std::vector<RankPlacement> plan;
  for (long r = 0; r < nproc; ++r) {
    const auto d = static_cast<std::size_t>(r * count / nproc);
    RankPlacement placement;
    placement.cpus = domains[d].cpus;
    placement.threads = std::max(1, physical_cores(topology, placement.cpus) / sharers[d]);
    placement.domain = domains[d].label;
    plan.push_back(std::move(placement));
  }
  return plan;
}

// What exclusive hands out whole: a physical core's usable hardware threads, or one hardware
// thread when there are fewer cores than ranks. Ordered by NUMA node, then core.
struct Unit {
  int node = 0;
  std::set<int> cpus;
};

std::vector<Unit> exclusive_units(const CpuTopology& topology, int nproc) {
  std::map<std::tuple<int, int, int>, Unit> cores, threads;  // (node, core, cpu or 0)
  for (int id : topology.usable) {
    const CpuInfo* cpu = topology.find(id);
    if (cpu == nullptr) continue;
    Unit& core = cores[{cpu->node, cpu->core, 0}];
    core.node = cpu->node;
    core.cpus.insert(id);
    threads[{cpu->node, cpu->core, id}] = Unit{cpu->node, {id}};
  }
  if (static_cast<int>(threads.size()) < nproc) {
    throw ddp::ConfigError(
        "--numa-binding exclusive: " + std::to_string(nproc) + " workers but only " +
        std::to_string(threads.size()) + " usable CPUs (" + format_cpu_list(topology.usable) +
        "), and no two workers may share one; lower --nproc-per-node to " +
        std::to_string(threads.size()) + " or less, or use --numa-binding node to share CPUs");
  }
  std::vector<Unit> units;
  for (auto& entry : static_cast<int>(cores.size()) >= nproc ? cores : threads) {
    units.push_back(std::move(entry.second));
  }
  return units;
}

// [begin, end) split into k contiguous ranges whose sizes differ by at most one.
void split_evenly(int begin, int end, int k, std::vector<std::pair<int, int>>& ranges) {
  const int count = end - begin;
  for (int j = 0, start = begin; j < k; ++j) {
    const int size = count / k + (j < count % k ? 1 : 0);
    ranges.emplace_back(start, start + size);
    start += size;
  }
}

// Each node's units as an index range (units are ordered by node).
std::vector<std::pair<int, int>> node_ranges(const std::vector<Unit>& units) {
  std::vector<std::pair<int, int>> nodes;
  for (int i = 0; i < static_cast<int>(units.size()); ++i) {
    if (i == 0 || units[i].node != units[i - 1].node) {
      nodes.emplace_back(i, i + 1);
    } else {
      nodes.back().second = i + 1;
    }
  }
  return nodes;
}

// How many ranks each node takes, in proportion to its units (D'Hondt: the next rank goes to
// the node with the most units per rank, the lower node on a tie).
std::vector<int> ranks_per_node(const std::vector<std::pair<int, int>>& nodes, int nproc) {
  std::vector<int> ranks(nodes.size(), 0);
  for (int r = 0; r < nproc; ++r) {
    std::size_t best = 0;
    for (std::size_t i = 1; i < nodes.size(); ++i) {
      const long size_i = nodes[i].second - nodes[i].first;
      const long size_best = nodes[best].second - nodes[best].first;
      if (size_i * (ranks[best] + 1) > size_best * (ranks[i] + 1)) best = i;
    }
    ++ranks[best];
  }
  return ranks;
}

// The units of each rank, as index ranges. First each NUMA node takes ranks in proportion to its
// units and splits its own units among them: no set crosses a node. That plan is kept when its
// smallest set is no smaller than an even split of all units would give (the counts allow it);
// else all units are split evenly in order, and a set may span two nodes.
std::vector<std::pair<int, int>> exclusive_ranges(const std::vector<Unit>& units, int nproc) {
  const auto nodes = node_ranges(units);
  const auto ranks = ranks_per_node(nodes, nproc);
  const int total = static_cast<int>(units.size());
  int smallest = total;
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    if (ranks[i] > 0) smallest = std::min(smallest, (nodes[i].second - nodes[i].first) / ranks[i]);
  }
  std::vector<std::pair<int, int>> ranges;
  if (smallest < total / nproc) {
    split_evenly(0, total, nproc, ranges);
    return ranges;
  }
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    if (ranks[i] > 0) split_evenly(nodes[i].first, nodes[i].second, ranks[i], ranges);
  }
  return ranges;
}

std::vector<RankPlacement> plan_exclusive(const CpuTopology& topology, int nproc) {
  const std::vector<Unit> units = exclusive_units(topology, nproc);
  std::vector<RankPlacement> plan;
  for (const auto& [begin, end] : exclusive_ranges(units, nproc)) {
    RankPlacement placement;
    std::set<int> nodes;
    for (int u = begin; u < end; ++u) {
      placement.cpus.insert(units[u].cpus.begin(), units[u].cpus.end());
      nodes.insert(units[u].node);
    }
    placement.threads = std::max(1, physical_cores(topology, placement.cpus));
    placement.domain = (nodes.size() == 1 ? "node " : "nodes ") + format_cpu_list(nodes);
    plan.push_back(std::move(placement));
  }
  return plan;
}

// The node's threads may not exceed the cgroup's CPU quota: each rank's count shrinks in
// proportion (rounded down, at least 1).
void cap_to_quota(std::vector<RankPlacement>& plan, std::optional<int> quota) {
  if (!quota) return;
  long total = 0;
  for (const auto& placement : plan) total += placement.threads;
  if (total <= *quota) return;
  for (auto& placement : plan) {
    placement.threads = std::max(1, static_cast<int>(placement.threads * *quota / total));
  }
}

}  // namespace

BindingPolicy parse_binding_policy(const std::string& what, const std::string& text) {
  for (BindingPolicy policy : {BindingPolicy::kNode, BindingPolicy::kSocket,
                               BindingPolicy::kExclusive, BindingPolicy::kCoreComplex}) {
    if (text == to_string(policy)) return policy;
  }
  throw ddp::ConfigError(what + "='" + text +
                         "' is not a binding; use node, socket, exclusive or core-complex "
                         "(torchrun's names), or leave it out for no binding");
}

const char* to_string(BindingPolicy policy) {
  switch (policy) {
    case BindingPolicy::kNode:
      return "node";
    case BindingPolicy::kSocket:
      return "socket";
    case BindingPolicy::kExclusive:
      return "exclusive";
    case BindingPolicy::kCoreComplex:
      return "core-complex";
  }
  return "unknown";
}

int physical_cores(const CpuTopology& topology, const std::set<int>& cpus) {
  std::set<int> cores;
  for (int id : cpus) {
    if (const CpuInfo* cpu = topology.find(id)) cores.insert(cpu->core);
  }
  return static_cast<int>(cores.size());
}

std::vector<RankPlacement> plan_binding(const CpuTopology& topology, int nproc,
                                        BindingPolicy policy) {
  if (topology.usable.empty()) {
    throw ddp::ConfigError(
        "--numa-binding " + std::string(to_string(policy)) +
        ": this process may use none of the online CPUs (its affinity mask and the cgroup's "
        "cpuset.cpus.effective share none); fix the cpuset or leave out --numa-binding");
  }
  if (nproc < 1) throw ddp::ConfigError("--numa-binding: no worker to place");
  std::vector<RankPlacement> plan = policy == BindingPolicy::kExclusive
                                        ? plan_exclusive(topology, nproc)
                                        : plan_shared(topology, nproc, policy);
  cap_to_quota(plan, topology.cpu_quota);
  return plan;
}

std::string describe_placement(const std::string& who, const RankPlacement& placement) {
  return who + ": cpus " + format_cpu_list(placement.cpus) + " (" + placement.domain + "), " +
         std::to_string(placement.threads) + (placement.threads == 1 ? " thread" : " threads");
}

std::string binding_hint(int nproc, int usable_cpus) {
  if (nproc < 2 || usable_cpus <= 2 * nproc) return "";
  return std::to_string(nproc) + " workers get OMP_NUM_THREADS=1 each (torchrun's rule) on " +
         std::to_string(usable_cpus) +
         " usable CPUs; --numa-binding exclusive gives each worker cores of its own and a thread "
         "per core";
}

}  // namespace ddprun
