#pragma once
// One call to join the job a launcher (ddprun or torchrun) started: reads the environment,
// connects the rendezvous store and creates the communicator of the chosen backend.
#include <memory>

#include "ddp/comm/communicator.h"
#include "ddp/env.h"
#include "ddp/store.h"

namespace ddp {

struct ProcessGroup {
  DistributedEnv env;
  std::shared_ptr<Store> store;
  std::unique_ptr<Communicator> comm;
};

// Checks every DDP_* setting first (settings::validate_all). Backend from DDP_BACKEND (default
// gloo), timeout from DDP_TIMEOUT_SEC (default 30 min).
ProcessGroup init_process_group();

}  // namespace ddp
