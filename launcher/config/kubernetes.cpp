#include "config/kubernetes.h"

#include "ddp/env_vars.h"
#include "ddp/error.h"

namespace ddprun {
namespace {

constexpr long kMaxNodes = 1 << 20;

std::optional<std::string> lookup(const EnvMap& env, const std::string& name) {
  auto it = env.find(name);
  if (it == env.end() || it->second.empty()) return std::nullopt;
  return it->second;
}

std::optional<int> lookup_int(const EnvMap& env, const std::string& name, long lo, long hi) {
  auto text = lookup(env, name);
  if (!text) return std::nullopt;
  return static_cast<int>(ddp::env::parse_int(name, *text, lo, hi));
}

// "train-1.train.default.svc.cluster.local" -> "train"; "" when the name has no subdomain.
std::string subdomain_of(const std::string& fqdn) {
  auto first = fqdn.find('.');
  if (first == std::string::npos) return "";
  auto second = fqdn.find('.', first + 1);
  return fqdn.substr(first + 1,
                     second == std::string::npos ? std::string::npos : second - first - 1);
}

void derive_indexed_job_master(PodPlacement& p, const HostFacts& host, int index) {
  const std::string suffix = "-" + std::to_string(index);
  const std::string& name = host.hostname;
  if (name.size() <= suffix.size() ||
      name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) {
    p.master_problem = "hostname '" + name + "' does not end in '-" + std::to_string(index) +
                       "' (JOB_COMPLETION_INDEX), so the index-0 pod's name is unknown; pass "
                       "--master-addr or set MASTER_ADDR";
    return;
  }
  const std::string fqdn = host.fqdn ? host.fqdn() : name;
  const std::string subdomain = subdomain_of(fqdn);
  if (subdomain.empty()) {
    p.master_problem = "pod '" + name + "' has no subdomain (its FQDN is '" + fqdn +
                       "'); set the pod template's subdomain to a headless Service, or pass "
                       "--master-addr";
    return;
  }
  const std::string job = name.substr(0, name.size() - suffix.size());
  p.pod_prefix = job + "-";
  p.pod_domain = "." + subdomain;
  p.master_addr =
      Sourced<std::string>{job + "-0." + subdomain, "hostname " + name + " and FQDN " + fqdn};
}

void detect_jobset(PodPlacement& p, const EnvMap& env, const HostFacts& host, bool derive_master,
                   const std::string& jobset) {
  p.platform = "JobSet";
  p.needs_node_count = true;
  const auto pod_index = lookup_int(env, "JOB_COMPLETION_INDEX", 0, kMaxNodes);
  const int job_index = lookup_int(env, "JOB_INDEX", 0, kMaxNodes).value_or(0);
  const auto replicas = lookup_int(env, "REPLICATED_JOB_REPLICAS", 1, kMaxNodes);
  const auto rjob = lookup(env, "REPLICATED_JOB_NAME");
  if (!rjob) {
    throw ddp::ConfigError(
        "JOBSET_NAME is set but REPLICATED_JOB_NAME is not; expose the label "
        "jobset.sigs.k8s.io/replicatedjob-name as REPLICATED_JOB_NAME through the downward API");
  }
  // Without a pod index each job has one pod, and the job index is the node rank.
  p.node_rank =
      Sourced<int>{pod_index.value_or(job_index), pod_index ? "JOB_COMPLETION_INDEX" : "JOB_INDEX"};
  if (pod_index && replicas && *replicas > 1) {
    p.jobset_job_index = job_index;
    p.jobset_replicas = *replicas;
    p.node_rank->source = "JOB_INDEX and JOB_COMPLETION_INDEX";
  }
  if (derive_master) {
    const std::string fqdn = host.fqdn ? host.fqdn() : host.hostname;
    std::string subdomain = subdomain_of(fqdn);
    // JobSet's default subdomain is the JobSet's name.
    if (subdomain.empty()) subdomain = jobset;
    p.master_addr =
        Sourced<std::string>{jobset + "-" + *rjob + "-0-0." + subdomain, "JobSet labels"};
  }
}

}  // namespace

PodPlacement detect_pod_placement(const EnvMap& env, const HostFacts& host, bool derive_master) {
  PodPlacement p;
  if (auto jobset = lookup(env, "JOBSET_NAME")) {
    detect_jobset(p, env, host, derive_master, *jobset);
  } else if (auto index = lookup_int(env, "JOB_COMPLETION_INDEX", 0, kMaxNodes)) {
    p.platform = "Kubernetes Indexed Job";
    p.needs_node_count = true;
    p.node_rank = Sourced<int>{*index, "JOB_COMPLETION_INDEX"};
    if (derive_master) derive_indexed_job_master(p, host, *index);
  } else if (lookup(env, "RANK") && lookup(env, "WORLD_SIZE") && lookup(env, "MASTER_ADDR") &&
             !lookup(env, "PET_NNODES")) {
    // A Kubeflow PyTorchJob without elasticPolicy: one process per pod, RANK is the pod's rank.
    p.platform = "Kubeflow PyTorchJob";
    const int world = *lookup_int(env, "WORLD_SIZE", 1, kMaxNodes);
    const int rank = *lookup_int(env, "RANK", 0, kMaxNodes);
    if (rank >= world) {
      throw ddp::ConfigError("RANK=" + std::to_string(rank) +
                             " is not below WORLD_SIZE=" + std::to_string(world) +
                             " (PyTorchJob: RANK is the pod's rank among WORLD_SIZE pods); fix "
                             "the pod environment or pass --node-rank/--nnodes");
    }
    p.nnodes = Sourced<int>{world, "WORLD_SIZE"};
    p.node_rank = Sourced<int>{rank, "RANK"};
  }
  if (auto addr = lookup(env, "MASTER_ADDR")) {
    p.master_addr = Sourced<std::string>{*addr, "MASTER_ADDR"};
    p.master_problem.clear();
  }
  if (auto port = lookup_int(env, "MASTER_PORT", 1, 65535)) {
    p.master_port = Sourced<int>{*port, "MASTER_PORT"};
  }
  return p;
}

void finish_jobset_node_rank(PodPlacement& p, int nnodes, const std::string& nnodes_source) {
  if (p.jobset_replicas <= 1 || !p.node_rank) return;
  if (nnodes % p.jobset_replicas != 0) {
    throw ddp::ConfigError(
        "the node count " + std::to_string(nnodes) + " (from " + nnodes_source +
        ") is not a multiple of REPLICATED_JOB_REPLICAS=" + std::to_string(p.jobset_replicas) +
        "; set --nnodes to replicas x pods per job");
  }
  const int per_job = nnodes / p.jobset_replicas;
  if (p.node_rank->value >= per_job) {
    throw ddp::ConfigError("JOB_COMPLETION_INDEX=" + std::to_string(p.node_rank->value) +
                           " is not below the pods per job " + std::to_string(per_job) +
                           " (node count " + std::to_string(nnodes) + " / " +
                           std::to_string(p.jobset_replicas) + " replicated jobs)");
  }
  p.node_rank->value += p.jobset_job_index * per_job;
  p.jobset_replicas = 1;
}

}  // namespace ddprun
