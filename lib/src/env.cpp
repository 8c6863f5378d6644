#include "ddp/env.h"

#include "ddp/env_vars.h"
#include "ddp/error.h"
#include "ddp/settings.h"

namespace ddp {
namespace {

constexpr long kMaxWorld = 1 << 20;

}  // namespace

DistributedEnv DistributedEnv::from_environment() {
  DistributedEnv e;
  e.world_size = static_cast<int>(env::get_int("WORLD_SIZE", 1, kMaxWorld).value_or(1));
  e.rank = static_cast<int>(env::get_int("RANK", 0, kMaxWorld).value_or(0));
  if (e.rank >= e.world_size) {
    throw ConfigError("RANK=" + std::to_string(e.rank) + " is not below WORLD_SIZE=" +
                      std::to_string(e.world_size) + "; ranks run from 0 to WORLD_SIZE-1");
  }
  e.local_world_size =
      static_cast<int>(env::get_int("LOCAL_WORLD_SIZE", 1, e.world_size).value_or(1));
  e.local_rank = static_cast<int>(env::get_int("LOCAL_RANK", 0, kMaxWorld).value_or(0));
  if (env::get("LOCAL_WORLD_SIZE") && e.local_rank >= e.local_world_size) {
    throw ConfigError("LOCAL_RANK=" + std::to_string(e.local_rank) +
                      " is not below LOCAL_WORLD_SIZE=" + std::to_string(e.local_world_size));
  }
  if (auto addr = env::get("MASTER_ADDR")) e.master_addr = *addr;
  e.master_port = static_cast<int>(env::get_int("MASTER_PORT", 1, 65535).value_or(29500));
  if (e.world_size > 1 && (!env::get("MASTER_ADDR") || !env::get("MASTER_PORT"))) {
    throw ConfigError("WORLD_SIZE=" + std::to_string(e.world_size) +
                      " but MASTER_ADDR/MASTER_PORT are not set; start the job with ddprun or "
                      "export both to the rendezvous host and port");
  }
  e.use_agent_store = env::get_bool("TORCHELASTIC_USE_AGENT_STORE").value_or(false);
  e.restart_count =
      static_cast<int>(env::get_int("TORCHELASTIC_RESTART_COUNT", 0, 1 << 30).value_or(0));
  e.run_id = env::get("TORCHELASTIC_RUN_ID").value_or("");
  return e;
}

std::string DistributedEnv::describe() const {
  return "rank " + std::to_string(rank) + "/" + std::to_string(world_size) + " (local " +
         std::to_string(local_rank) + "/" + std::to_string(local_world_size) + "), master " +
         master_addr + ":" + std::to_string(master_port);
}

std::chrono::milliseconds collective_timeout_from_environment() {
  const long seconds = settings::integer(settings::kTimeoutSec).value_or(30 * 60);
  return std::chrono::seconds(seconds);
}

}  // namespace ddp
