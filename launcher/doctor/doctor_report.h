#pragma once
// What `ddprun doctor` knows and concludes, without any I/O (doctor.h gathers it): each node's
// facts, the findings they lead to, the links measured around the ring of nodes, the allreduce
// sweep, the verdict, and the table node 0 prints. Facts travel between agents as JSON.
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "doctor/link_probe.h"

namespace ddprun::doctor {

struct DnsAnswer {
  std::string name;
  bool resolved = false;
  double ms = 0;
  std::string error;
};

// The CPU, for the "cpu" check.
struct CpuFacts {
  std::string arch;   // uname's machine: "x86_64", "aarch64"
  std::string model;  // cpu_model_from_cpuinfo
  bool sve = false;   // arm64's Scalable Vector Extension (hwcaps)
  bool native_bf16 = false;
  std::string bf16_feature;  // what native_bf16 looks for: "bf16" (arm64), "avx512_bf16"
};

// The CPU model /proc/cpuinfo names: x86-64's "model name"; on arm64 the core its implementer
// and part number name, with the AWS Graviton built on it ("Neoverse V1 (AWS Graviton3)"), or
// "arm64 part 0x..." for a part not in the table. "unknown" when neither is there.
std::string cpu_model_from_cpuinfo(const std::string& cpuinfo);

// One node's facts, as its agent read them.
struct NodeFacts {
  int node = 0;
  std::string hostname;
  std::string address;  // where its link probe listens
  int probe_port = 0;
  int usable_cpus = 0;
  CpuFacts cpu;
  bool fi_info_found = false;
  std::vector<std::string> providers;
  int efa_devices = 0;            // /dev/infiniband/uverbs*
  long long memlock_bytes = -1;   // RLIMIT_MEMLOCK (soft); -1 unlimited
  long long nofile_soft = 0;      // RLIMIT_NOFILE
  long long hugepages_total = 0;  // /proc/meminfo
  long long hugepages_free = 0;
  long long shm_free_bytes = -1;  // /dev/shm, -1 when it is missing
  long long shm_size_bytes = -1;
  std::vector<DnsAnswer> dns;  // every peer's hostname, resolved here
};

struct Requirements {
  int nproc_per_node = 1;
  int world_size = 1;
  long long shm_min_bytes = 0;  // free room /dev/shm must have
  std::string backend = "gloo";
  std::string provider;  // DDP_FABRIC_PROVIDER or FI_PROVIDER when set ("tcp;ofi_rxm", ...)
  double slow_dns_ms = 1000;
  bool bf16 = false;  // the program's command line asks for --bf16
};

// The free /dev/shm a node needs by default: 64 MiB per rank, at least 256 MiB (Docker's default
// of 64 MiB is what breaks shared-memory transports and DataLoader workers).
long long default_shm_min_bytes(int nproc_per_node);

enum class Level { kOk, kWarn, kBad };

struct Finding {
  std::string check;  // "cpus", "cpu", "shm", "memlock", "nofile", "hugepages", "providers", "dns"
  Level level = Level::kOk;
  std::string text;  // what was seen, and for kWarn/kBad the fix
};

std::vector<Finding> evaluate_node(const NodeFacts& facts, const Requirements& requirements);

// One ring link: `from` measured towards `to`.
struct LinkResult {
  int from = 0;
  int to = 0;
  LinkFigures figures;
  std::string error;  // non-empty: the measure failed
};

// The ring's links in phases: in one phase no node is in two links, so each phase's links are
// measured at once. N = 1: none; N = 2: the one link; odd N: three phases, even N: two.
std::vector<std::vector<std::pair<int, int>>> ring_phases(int nodes);

struct SweepPoint {
  long long bytes = 0;
  double seconds = 0;  // per allreduce
  double busbw_gbps = 0;
};

struct Verdict {
  std::set<int> bad_nodes;
  std::map<int, std::string> reason;  // each bad node's first problem
  std::vector<std::string> problems;  // one line each: a node's finding or a link
  std::vector<std::string> warnings;
  std::set<std::pair<int, int>> slow_links;
  double median_gbps = 0;  // over every direction of every link; 0 when not judged
};

// A link direction is slow below half the median of all directions (with 3 links or more) or
// below `min_gbps` (when > 0); its latency is slow above twice the median and 100 µs more.
// A slow link's two ends are bad, unless one end is in every slow link of its own and the
// other is not: then only that one (a node with a bad NIC slows both its ring neighbours).
Verdict judge(const std::vector<NodeFacts>& nodes,
              const std::vector<std::vector<Finding>>& findings,
              const std::vector<LinkResult>& links, double min_gbps);

// A node's name in the report: its hostname when every node's is distinct, else "node N".
std::string node_label(const std::vector<NodeFacts>& nodes, int node);

// The table node 0 prints: nodes, links, the sweep (may be empty), the verdict.
std::string render(const std::vector<NodeFacts>& nodes,
                   const std::vector<std::vector<Finding>>& findings,
                   const std::vector<LinkResult>& links, const std::vector<SweepPoint>& sweep,
                   const std::string& sweep_note, const Verdict& verdict,
                   const Requirements& requirements);

std::string facts_to_json(const NodeFacts& facts, const std::vector<LinkResult>& links);
// Throws std::runtime_error for malformed JSON.
NodeFacts facts_from_json(const std::string& json, std::vector<LinkResult>& links);
std::string sweep_to_json(const std::vector<SweepPoint>& sweep);
std::vector<SweepPoint> sweep_from_json(const std::string& json);
std::string verdict_to_json(const Verdict& verdict);
Verdict verdict_from_json(const std::string& json);

}  // namespace ddprun::doctor
