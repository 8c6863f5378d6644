#pragma once
// The agents' meeting point: the node-rank-0 agent (or the c10d endpoint's host) serves a
// c10d TCPStore; every agent connects to it (retrying DNS and connection until the join
// timeout, since a pod's peers and their DNS records appear in any order).
//
// Rounds: the job runs in rounds 0, 1, ...; a restart moves every node to the next round, and
// the round number is TORCHELASTIC_RESTART_COUNT. In a round, agents join, the round closes
// at the maximum node count (or at the minimum after last_call_timeout), and members are
// ordered by node rank (join order for nodes without one, kept across rounds). Any agent can
// publish the round's failure; all others see it within --monitor-interval and stop.
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "failure_report.h"
#include "host_facts.h"
#include "launch_config.h"
#include "worker_env.h"

namespace ddp {
class Store;
}

namespace ddprun {

class Rendezvous {
 public:
  // `poll_interrupt` is called while waiting; it throws to abandon the wait (a signal).
  Rendezvous(const LaunchConfig& config, const HostFacts& host,
             std::function<void()> poll_interrupt);
  ~Rendezvous();

  bool hosts_store() const { return hosts_store_; }
  // What workers get as MASTER_ADDR/MASTER_PORT.
  const std::string& store_host() const { return store_host_; }
  int store_port() const { return store_port_; }

  // Joins the job's current round and waits until it closes. Throws ddp::StoreError when the
  // round does not fill within the join timeout, ddp::ConfigError when two nodes claim one rank.
  NodeAssignment join();

  // The round's published failure, if any (throws ddp::StoreError when the store is gone).
  std::optional<FailureReport> failure(int round);
  // Publishes `report` unless the round already has a failure; returns the round's root cause.
  FailureReport publish_failure(int round, const FailureReport& report);
  // This node's workers have stopped after the round's failure.
  void acknowledge_stop(int round);
  // Moves the job from `round` to the next one (idempotent across agents).
  void advance(int round);
  // Exit barrier after this node's workers all succeeded: waits for the other nodes, up to the
  // exit barrier timeout. Returns the round's failure if one is published meanwhile.
  std::optional<FailureReport> finish(int round, int nodes);
  // The store's host waits (bounded) until every node has acknowledged the stop, so that none
  // loses the store before it has read the failure.
  void linger_until_stopped(int round, int nodes);

 private:
  NodeAssignment try_join(int round, std::chrono::steady_clock::time_point deadline, bool& late);
  void connect_with_retry(std::chrono::steady_clock::time_point deadline);
  std::string key(int round, const std::string& name) const;

  const LaunchConfig& config_;
  const HostFacts& host_;
  std::function<void()> poll_interrupt_;
  std::shared_ptr<ddp::Store> server_;  // kept alive on the hosting node
  std::shared_ptr<ddp::Store> store_;   // this agent's view, prefixed by the run id
  bool hosts_store_ = false;
  std::string store_host_;
  int store_port_ = 0;
  int preferred_rank_ = -1;  // group rank from the previous round, for nodes without a rank
};

}  // namespace ddprun
