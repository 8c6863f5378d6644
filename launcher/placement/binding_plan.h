#pragma once
// --numa-binding for CPU ranks: which CPUs each local rank is bound to, and how many threads it
// runs, from the machine's topology (topology.h). A pure function of its inputs; the agent logs
// the plan and the supervisor applies it (the affinity between fork and exec, the thread count
// through OMP_NUM_THREADS, OPENBLAS_NUM_THREADS and MKL_NUM_THREADS). README.md: the semantics.
#include <set>
#include <string>
#include <vector>

#include "placement/topology.h"

namespace ddprun {

// torchrun's AffinityMode values (torch/numa/binding.py), with CPU semantics.
enum class BindingPolicy { kNode, kSocket, kExclusive, kCoreComplex };

// "node", "socket", "exclusive" or "core-complex"; throws ddp::ConfigError naming `what` (the
// flag or PET_ variable) and the four values for anything else.
BindingPolicy parse_binding_policy(const std::string& what, const std::string& text);
const char* to_string(BindingPolicy policy);

struct RankPlacement {
  std::set<int> cpus;  // never empty
  int threads = 1;     // OMP_NUM_THREADS and the others
  std::string domain;  // what the set is: "node 0", "socket 1", "L3 2", "nodes 0-1"
};

// One placement per local rank 0..nproc-1 on `topology`'s usable CPUs, capped by its quota.
// Throws ddp::ConfigError when the policy cannot give every rank a CPU (exclusive with fewer
// usable CPUs than ranks; any policy with no usable CPU).
std::vector<RankPlacement> plan_binding(const CpuTopology& topology, int nproc,
                                        BindingPolicy policy);

// "rank 0: cpus 0-15 (L3 0), 16 threads": `who` is "rank 0" or "local rank 0".
std::string describe_placement(const std::string& who, const RankPlacement& placement);

// Without --numa-binding, where torchrun's OMP_NUM_THREADS=1 for several workers leaves more
// than two usable CPUs per worker: the line that suggests --numa-binding exclusive. "" where it
// does not (one worker, or few CPUs per worker).
std::string binding_hint(int nproc, int usable_cpus);

// The physical cores among `cpus` (a core counts when any of its hardware threads is there).
int physical_cores(const CpuTopology& topology, const std::set<int>& cpus);

}  // namespace ddprun
