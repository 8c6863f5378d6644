#pragma once
// Runs one round of this node's workers: spawns them with torchrun's environment, pumps their
// output, watches for exits, for signals to ddprun and (every --monitor-interval) for a failure
// published by another node; on any failure stops the whole local group (the signal, then
// SIGKILL after --shutdown-timeout) and reports the root cause.
#include <optional>
#include <string>

#include "failure_report.h"
#include "host_facts.h"
#include "launch_config.h"
#include "rendezvous.h"
#include "signal_inbox.h"
#include "worker_env.h"

namespace ddprun {

struct RoundOutcome {
  enum class Kind {
    kSucceeded,    // every worker on this node exited 0
    kFailed,       // a worker here or on another node failed: see root_cause
    kInterrupted,  // ddprun itself got a signal: see signal, exit_code
    kStoreLost,    // the rendezvous store stopped answering
  };
  Kind kind = Kind::kSucceeded;
  std::optional<FailureReport> root_cause;
  int signal = 0;
  int exit_code = 0;
  std::string detail;
};

class Supervisor {
 public:
  // `program` is the resolved path of config.command[0]; `log_root` holds attempt_N/ folders.
  Supervisor(const LaunchConfig& config, const EnvMap& agent_env, std::string program,
             std::string log_root, SignalInbox& inbox, Rendezvous& rendezvous,
             std::string hostname);

  RoundOutcome run(const NodeAssignment& node);

  // The folder of one worker's logs and error file in a round.
  std::string worker_dir(int round, int local_rank) const;

 private:
  const LaunchConfig& config_;
  const EnvMap& agent_env_;
  std::string program_;
  std::string log_root_;
  SignalInbox& inbox_;
  Rendezvous& rendezvous_;
  std::string hostname_;
};

}  // namespace ddprun
