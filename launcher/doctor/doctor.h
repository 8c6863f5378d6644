#pragma once
// `ddprun doctor` (the job's command line with `doctor` before the program) and `--preflight`:
// every node's agent checks its pod (CPUs against --nproc-per-node, /dev/shm room, memlock and
// nofile limits, huge pages, libfabric providers, EFA devices, DNS of every peer), measures the
// ring of links to its neighbour nodes over TCP (latency, bandwidth both ways), runs an
// allreduce sweep over the chosen backend with the job's ranks, and node 0 prints one table and
// a verdict naming each pod or link that is off. Facts and the verdict travel through the
// round's store (doctor_report.h holds the judging; link_probe.h the measure).
#include <functional>
#include <string>

#include "config/host_facts.h"
#include "config/launch_config.h"
#include "config/worker_env.h"
#include "rendezvous/rendezvous.h"

namespace ddprun {

// Runs the doctor on this node, in `node`'s round. Returns 0 when every node is healthy,
// ddp::exit_code::kNodeBad when this node or one of its links is bad, and (with
// config.preflight, where the job cannot start either) kRendezvous when only other nodes are.
// `poll_interrupt` is called while waiting and throws to abandon (a signal).
int run_doctor(const LaunchConfig& config, const HostFacts& host, const EnvMap& env,
               Rendezvous& rendezvous, const NodeAssignment& node, const std::string& log_root,
               const std::function<void()>& poll_interrupt);

}  // namespace ddprun
