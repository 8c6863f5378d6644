#pragma once
// What ddprun needs to know about the machine it runs on. Gathered once in main() and passed
// in, so that configuration resolution stays a pure function that tests can feed.
#include <functional>
#include <map>
#include <string>

namespace ddprun {

using EnvMap = std::map<std::string, std::string>;

// The process environment as a map.
EnvMap current_environment();

struct HostFacts {
  std::string hostname;
  // The canonical (fully qualified) name of `hostname`; in a pod with a subdomain,
  // "<pod>.<subdomain>.<namespace>.svc.<cluster-domain>". Called only when needed.
  std::function<std::string()> fqdn;
  int usable_cpus = 1;  // CPU affinity, capped by the cgroup CPU quota
  int gpus = 0;
  std::string unique_id;  // a fresh random id (run id of --standalone jobs)

  static HostFacts probe();
};

}  // namespace ddprun
