#include "config/host_facts.h"

#include <netdb.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <random>
#include <regex>

#include "ddp/error.h"
#include "placement/topology.h"

extern char** environ;

namespace ddprun {
namespace {

std::string canonical_name(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_flags = AI_CANONNAME;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &found) != 0 || found == nullptr) return host;
  std::string name = found->ai_canonname != nullptr ? found->ai_canonname : host;
  freeaddrinfo(found);
  return name;
}

// cgroup v2 "cpu.max": Kubernetes CPU limits land there, not in the affinity mask. 0: none, or
// a file that cannot be read as one (the count then comes from the affinity alone).
int cgroup_cpu_limit() {
  try {
    return read_cpu_quota("/").value_or(0);
  } catch (const ddp::Error&) {
    return 0;
  }
}

int count_gpus() {
  int n = 0;
  std::error_code ec;
  const std::regex device("nvidia[0-9]+");
  for (const auto& entry : std::filesystem::directory_iterator("/dev", ec)) {
    if (std::regex_match(entry.path().filename().string(), device)) ++n;
  }
  return n;
}

}  // namespace

EnvMap current_environment() {
  EnvMap env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    std::string entry = *e;
    auto eq = entry.find('=');
    if (eq == std::string::npos) continue;
    env.emplace(entry.substr(0, eq), entry.substr(eq + 1));
  }
  return env;
}

HostFacts HostFacts::probe() {
  HostFacts facts;
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) == 0) facts.hostname = name;
  facts.fqdn = [host = facts.hostname] { return canonical_name(host); };
  cpu_set_t set;
  CPU_ZERO(&set);
  facts.usable_cpus = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 1;
  if (int limit = cgroup_cpu_limit(); limit > 0)
    facts.usable_cpus = std::min(facts.usable_cpus, limit);
  facts.gpus = count_gpus();
  std::random_device random;
  char id[17] = {};
  std::snprintf(id, sizeof(id), "%08x%08x", random(), random());
  facts.unique_id = id;
  return facts;
}

}  // namespace ddprun
