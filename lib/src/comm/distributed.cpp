#include "ddp/distributed.h"

#include "ddp/comm/factory.h"
#include "ddp/log.h"
#include "ddp/settings.h"

namespace ddp {

ProcessGroup init_process_group() {
  ProcessGroup group;
  settings::validate_all();
  group.env = DistributedEnv::from_environment();
  log::set_rank(group.env.rank);
  CommOptions options;
  options.timeout = collective_timeout_from_environment();
  const std::string backend = backend_from_env();
  group.store = Store::from_env(group.env, options.timeout);
  // A restarted group must not read the previous attempt's keys.
  auto scoped = group.store->with_prefix("ddp/" + std::to_string(group.env.restart_count));
  group.comm = create_communicator(backend, scoped, group.env.rank, group.env.world_size, options);
  log::info("joined as {} with backend {}", group.env.describe(), backend);
  return group;
}

}  // namespace ddp
