#pragma once
// torchrun's worker environment contract: what each worker process finds in its environment.
#include <string>

#include "config/host_facts.h"
#include "config/launch_config.h"

namespace ddprun {

// One node's share of a rendezvous round (see rendezvous.h).
struct NodeAssignment {
  int round = 0;             // TORCHELASTIC_RESTART_COUNT: the same on every node
  int group_rank = 0;        // this node's rank among the nodes of the round
  int group_world_size = 1;  // nodes in the round
  int rank_offset = 0;       // global rank of this node's local rank 0
  int world_size = 1;        // workers in the round, all nodes
  // Rounds before this one that ended in a failure (what --max-restarts counts); a round ended by
  // a membership change of an elastic job is not one.
  int restarts = 0;
};

// Where a round's workers find their c10d store (MASTER_ADDR, MASTER_PORT), and who serves it:
// an agent (TORCHELASTIC_USE_AGENT_STORE=True, every worker a client), or worker rank 0
// (False: with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1, as torchrun does).
struct WorkerStore {
  std::string host;
  int port = 0;
  bool agent_hosted = true;
};

struct WorkerSlot {
  int local_rank = 0;
  std::string error_file;  // TORCHELASTIC_ERROR_FILE
  // Its thread count in the --numa-binding plan (placement/binding_plan.h); 0: no plan.
  int threads = 0;
};

// The agent's environment plus RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK,
// GROUP_WORLD_SIZE, ROLE_RANK, ROLE_WORLD_SIZE, ROLE_NAME, MASTER_ADDR, MASTER_PORT,
// TORCHELASTIC_*, and the thread counts: without a plan, OMP_NUM_THREADS=1 when unset and more
// than one worker shares the node (torchrun's rule); with one, OMP_NUM_THREADS,
// OPENBLAS_NUM_THREADS and MKL_NUM_THREADS = slot.threads, each unless the agent's environment
// sets it, and none of them when it sets OMP_NUM_THREADS (OpenBLAS and MKL fall back to it).
EnvMap worker_environment(const EnvMap& agent_env, const LaunchConfig& config,
                          const NodeAssignment& node, const WorkerSlot& slot,
                          const WorkerStore& store);

}  // namespace ddprun
