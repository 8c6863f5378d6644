#include "config/worker_env.h"

#include <sstream>

#include "config/python_hook.h"

namespace ddprun {
namespace {

// --virtual-local-rank: the worker's own entry of the agent's CUDA_VISIBLE_DEVICES, else its
// local rank (the configuration checked that the list is long enough).
std::string own_device(const EnvMap& agent_env, int local_rank) {
  auto it = agent_env.find("CUDA_VISIBLE_DEVICES");
  if (it == agent_env.end()) return std::to_string(local_rank);
  std::istringstream list(it->second);
  std::string device;
  for (int i = 0; i <= local_rank && std::getline(list, device, ','); ++i) {
  }
  const auto first = device.find_first_not_of(' ');
  const auto last = device.find_last_not_of(' ');
  return first == std::string::npos ? device : device.substr(first, last - first + 1);
}

// The OpenMP and BLAS thread counts; `env` is still the agent's for these variables.
void set_thread_counts(EnvMap& env, int nproc_per_node, int planned_threads) {
  if (planned_threads <= 0) {
    if (nproc_per_node > 1) env.emplace("OMP_NUM_THREADS", "1");
    return;
  }
  if (env.count("OMP_NUM_THREADS") != 0) return;  // the user's count, for OpenBLAS and MKL too
  for (const char* name : {"OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"}) {
    env.emplace(name, std::to_string(planned_threads));
  }
}

}  // namespace

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
  // torchrun's agent exports its --signals-to-handle; workers inherit it.
  env["TORCHELASTIC_SIGNALS_TO_HANDLE"] = config.signals_to_handle_text;
  if (!config.python_path_prepend.empty() || !config.python_path_append.empty()) {
    auto existing = agent_env.find("PYTHONPATH");
    env["PYTHONPATH"] = python_path(config.python_path_prepend,
                                    existing != agent_env.end() ? &existing->second : nullptr,
                                    config.python_path_append);
  }
  if (config.virtual_local_rank) {
    env["LOCAL_RANK"] = "0";
    env["CUDA_VISIBLE_DEVICES"] = own_device(agent_env, slot.local_rank);
  }
  env.emplace("NCCL_ASYNC_ERROR_HANDLING", "1");
  env.emplace("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1");
  set_thread_counts(env, config.nproc_per_node, slot.threads);
  return env;
}

}  // namespace ddprun
