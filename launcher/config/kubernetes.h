#pragma once
// Reads a node's place in the job from what Kubernetes workload controllers put in a pod:
//   Indexed Job  JOB_COMPLETION_INDEX, hostname "<job>-<index>", FQDN "<host>.<subdomain>...."
//   JobSet       JOBSET_NAME, REPLICATED_JOB_NAME, JOB_INDEX, REPLICATED_JOB_REPLICAS (from the
//                jobset.sigs.k8s.io/* labels through the downward API) + JOB_COMPLETION_INDEX
//   PyTorchJob   MASTER_ADDR, MASTER_PORT, WORLD_SIZE (nodes) and RANK (node rank)
// Kubeflow TrainJob and elastic PyTorchJobs set PET_* instead, which launch_config.h reads as
// flag defaults. These values rank below flags and PET_*.
#include <optional>
#include <string>

#include "config/host_facts.h"

namespace ddprun {

// A value and where it came from ("JOB_COMPLETION_INDEX", "--nnodes", ...), for messages.
template <typename T>
struct Sourced {
  T value;
  std::string source;
};

struct PodPlacement {
  std::string platform;  // "" outside a recognized controller
  std::optional<Sourced<int>> node_rank;
  std::optional<Sourced<int>> nnodes;
  std::optional<Sourced<std::string>> master_addr;
  std::optional<Sourced<int>> master_port;
  // When the platform implies a master that could not be derived: why, and how to fix it.
  std::string master_problem;
  // A node count must come from --nnodes, PET_NNODES or DDP_NNODES.
  bool needs_node_count = false;
  // JobSet with several jobs in the replicated job: node rank = job index x pods per job + pod
  // index, completed by finish_jobset_node_rank once the node count is known.
  int jobset_job_index = 0;
  int jobset_replicas = 1;
  // An Indexed Job's pods are named <pod_prefix><index><pod_domain> ("train-", ".train"): where
  // an agent looks for a store that moved off pod 0 (LaunchConfig's store_peers).
  std::string pod_prefix;
  std::string pod_domain;
};

// `derive_master`: whether to work out the master address from the pod's names (it may resolve
// the FQDN, so callers skip it when the address is given otherwise).
// Throws ddp::ConfigError naming the variable when a value is malformed.
PodPlacement detect_pod_placement(const EnvMap& env, const HostFacts& host, bool derive_master);

// Turns the pod index into the node rank across all jobs of a JobSet's replicated job.
void finish_jobset_node_rank(PodPlacement& p, int nnodes, const std::string& nnodes_source);

}  // namespace ddprun
