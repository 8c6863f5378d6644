#pragma once
// One node's agent from start to exit: rendezvous, rounds of workers, restarts, the exit
// barrier, the root-cause summary and error file, and the exit code (ddp/exit_codes.h).
#include "config/host_facts.h"
#include "config/launch_config.h"
#include "supervision/signal_inbox.h"

namespace ddprun {

// Returns the process exit code. Throws ddp::ConfigError / ddp::StoreError for problems that
// stop the node before or between rounds (the caller maps them with for_exception).
int run_agent(const LaunchConfig& config, const HostFacts& host, const EnvMap& env,
              SignalInbox& inbox);

}  // namespace ddprun
