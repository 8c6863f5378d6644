#include "worker_env.h"

namespace ddprun {

EnvMap worker_environment(const EnvMap& agent_env, const LaunchConfig& config,
                          const NodeAssignment& node, const WorkerSlot& slot,
                          const WorkerStore& store) {
  EnvMap env = agent_env;
  const int rank = node.rank_offset + slot.local_rank;
  env["LOCAL_RANK"] = std::to_string(slot.local_rank);
  env["RANK"] = std::to_string(rank);
  env["GROUP_RANK"] = std::to_string(node.group_rank);
  env["ROLE_RANK"] = std::to_string(rank);
  env["ROLE_NAME"] = config.role;
  env["LOCAL_WORLD_SIZE"] = std::to_string(config.nproc_per_node);
  env["WORLD_SIZE"] = std::to_string(node.world_size);
  env["GROUP_WORLD_SIZE"] = std::to_string(node.group_world_size);
  env["ROLE_WORLD_SIZE"] = std::to_string(node.world_size);
  env["MASTER_ADDR"] = store.host;
  env["MASTER_PORT"] = std::to_string(store.port);
  env["TORCHELASTIC_RESTART_COUNT"] = std::to_string(node.round);
  env["TORCHELASTIC_MAX_RESTARTS"] = std::to_string(config.max_restarts);
  env["TORCHELASTIC_RUN_ID"] = config.run_id;
  env["TORCHELASTIC_USE_AGENT_STORE"] = store.agent_hosted ? "True" : "False";
  env["TORCHELASTIC_ERROR_FILE"] = slot.error_file;
  env.emplace("NCCL_ASYNC_ERROR_HANDLING", "1");
  env.emplace("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1");
  if (config.nproc_per_node > 1 && env.count("OMP_NUM_THREADS") == 0) {
    env["OMP_NUM_THREADS"] = "1";
  }
  return env;
}

}  // namespace ddprun
