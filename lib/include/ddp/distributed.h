#pragma once
// One call to join the job a launcher (ddprun or torchrun) started: reads the environment,
// connects the rendezvous store and creates the communicator of the chosen backend.
//
// In-process regrouping. Under ddprun (which sets DDP_REGROUP_FILE), a process may offer to
// regroup: on a membership change of an elastic job (a node lost, or one joining), ddprun then
// does not restart it. It sends a regroup notice instead (the abort notice's path,
// comm/abort_notice.h): the collectives in flight give up (a node lost) or the ranks stop after
// the same step (a node joins). The process keeps what it holds in memory, tells ddprun it is
// ready, and once the agents agreed on the next world, joins it with a new store connection and
// communicator: ProcessGroup::regroup(). train::Trainer does all of this when built on a
// ProcessGroup; any other program may do the same:
//
//   group.offer_regroup();
//   for (;;) {
//     try { train(*group.comm); break; }
//     catch (const std::exception&) { if (!ddp::regroup_requested()) throw; }
//     group.regroup();  // then agree with the new world's ranks on the state (a broadcast)
//   }
//
// A process that does not offer it (every Python worker) is stopped and restarted, as before.
#include <chrono>
#include <memory>

#include "ddp/comm/communicator.h"
#include "ddp/env.h"
#include "ddp/store.h"

namespace ddp {

struct ProcessGroup {
  DistributedEnv env;
  std::shared_ptr<Store> store;
  std::unique_ptr<Communicator> comm;

  // Whether the launcher offers in-process regrouping (ddprun sets DDP_REGROUP_FILE).
  bool can_regroup() const;
  // Tells ddprun this process regroups in-process, from now until withdraw_regroup() (both
  // no-ops where it cannot).
  void offer_regroup();
  void withdraw_regroup();
  // After regroup_requested(): tells ddprun this process is ready, waits for its place in the
  // next world, and joins it: `env` (which then also answers ddp::env reads of RANK, WORLD_SIZE,
  // ...), `store` and `comm` are replaced; the old communicator is destroyed first. Throws
  // CommError when no place comes within 15 min, ConfigError for a malformed one.
  void regroup();
};

// Checks every DDP_* setting first (settings::validate_all). Backend from DDP_BACKEND (default
// gloo), timeout from DDP_TIMEOUT_SEC (default 30 min).
ProcessGroup init_process_group();

// Whether ddprun asked this process to regroup (a regroup notice was raised). `wait`: how long to
// wait for the notice when none is raised yet: after a collective failed on its own (a peer's
// connections closed), ddprun learns of the lost node only later (DDP_REGROUP_WAIT_SEC is the
// bound ddprun sets). False in a process that did not offer to regroup.
bool regroup_requested(std::chrono::milliseconds wait = std::chrono::milliseconds(0));

}  // namespace ddp
