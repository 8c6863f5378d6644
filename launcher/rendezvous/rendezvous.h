#pragma once
// The agents' meeting point (store_rendezvous.h implements it): the node-rank-0 agent (or the c10d
// endpoint's host) serves the store (ddp::StoreServer); every agent connects to it (retrying DNS
// and connection until the join timeout, since a pod's peers and their DNS records appear in any
// order) and presents the job's join token, if any.
//
// Rounds: the job runs in rounds 0, 1, ...; a restart moves every node to the next round, and
// the round number is TORCHELASTIC_RESTART_COUNT. In a round, agents join, the round closes
// at the maximum node count (or at the minimum after last_call_timeout), and members are
// ordered by node rank (for nodes without one: kept across rounds, new ones by host name;
// member_order.h). Any agent can
// publish the round's failure; all others see it within --monitor-interval and stop.
//
// Elastic jobs (--nnodes MIN:MAX): a node that arrives after its round closed below MAX counts
// itself as waiting; the running agents see that within --monitor-interval and end the round as
// a membership change (a "membership" record in place of a failure), as they do when a node
// leaves because it was signalled. The next round then closes with the nodes present, and
// --max-restarts counts only the rounds that ended in a failure (NodeAssignment::restarts).
//
// Store failover (elastic c10d jobs): every round records each member's address as the others
// reach it, and which member hosts the store. When the store's host leaves or vanishes, the
// round's other nodes move the store to the lowest of them by group rank that answers (the
// next one after a window of the heartbeat limit and one interval, should that one be gone
// too), seed the next round there (round, restarts, survivors) and go on; the round after a
// move closes only with a majority of the last round's nodes, and the round after a node was
// lost by its heartbeat with at least half of them (the store's side wins a tie), so a node cut
// off alone does not train as a second job. An agent that would serve the store (a recreated pod
// 0), or cannot reach the endpoint, first looks for the job's live store at the store peers
// (rdzv-conf store_peers, or the Indexed Job's pod names) and joins it there. One that serves a
// store of its own and waits alone in its first round keeps looking, every 2 s, and moves.
//
// Workers' stores: round 0's workers use the agents' store (etcd-v2: a store the round's node 0
// serves); from round 1 on, each round's node 0 serves its workers a fresh store and publishes
// where. With TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 node 0 picks a port for worker rank 0 to
// serve one in every round, as torchrun does. PyTorch 2.x workers key nothing by attempt (torch's
// rendezvous.py: "We create a new TCPStore for every retry"): in a store shared across rounds a
// restarted rank would read its peers' gloo addresses of the round before and time out.
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "config/host_facts.h"
#include "config/launch_config.h"
#include "config/worker_env.h"
#include "diagnosis/failure_report.h"

namespace ddp {
class Store;
}

namespace ddprun {

class Rendezvous {
 public:
  virtual ~Rendezvous() = default;

  // The agents' store (an etcd endpoint with etcd-v2).
  virtual const std::string& store_host() const = 0;
  virtual int store_port() const = 0;
  // What the current round's workers get as MASTER_ADDR/MASTER_PORT (valid once join() returned):
  // a store of their own, where nothing an earlier round's workers wrote can be read.
  virtual WorkerStore worker_store() const = 0;

  // Joins the job's current round and waits until it closes. Throws ddp::StoreError when the
  // round does not fill within the join timeout, ddp::ConfigError when two nodes claim one rank.
  virtual NodeAssignment join() = 0;

  // The round's published failure, if any (throws ddp::StoreError when the store is gone).
  virtual std::optional<FailureReport> failure(int round) = 0;
  // Publishes `report` as the round's failure unless it already has one (which `report`
  // replaces if that one is only a consequence); returns the round's root cause so far.
  virtual FailureReport publish_failure(int round, const FailureReport& report) = 0;
  // Replaces the round's failure `before` (this node's own) with `after`, if still current.
  virtual void revise_failure(int round, const FailureReport& before,
                              const FailureReport& after) = 0;
  // A node declared lost (heartbeat.h) will never acknowledge its stop nor read the root cause:
  // counts both on its behalf, once however many agents declare it, so that no node waits for it.
  virtual void stand_in_for_lost(int round, int group_rank) = 0;
  // After a failure: this node's workers have stopped (and it published what it had to say).
  // `leaving`: the node exits now without settling (it was signalled).
  virtual void acknowledge_stop(int round, bool leaving) = 0;
  // When the job ends with the failure: waits (bounded by the shutdown timeout or the heartbeat
  // limit, whichever is longer, so that a lost node's verdict is in) until every node has
  // acknowledged, and returns the round's final root cause — the same on every node — or
  // `fallback` when the store cannot tell.
  virtual FailureReport settle_failure(int round, int nodes, const FailureReport& fallback) = 0;
  // Heartbeats (heartbeat.h): whether this agent watches the others (the store's host does),
  // this node's beat, every node's counter, and the host a group rank of the round runs on.
  virtual bool watches_heartbeats() const = 0;
  // The shortest --monitor-interval worth asking the store at: 0 for an agent's store, more for
  // etcd, which every agent's looks would load (StoreRendezvous::poll_cap).
  virtual std::chrono::milliseconds monitor_floor() const = 0;
  virtual void beat(int round, int group_rank, int64_t delta) = 0;
  virtual std::vector<int64_t> beats(int round, int nodes) = 0;
  virtual std::string node_host(int round, int group_rank) = 0;
  // Nodes that arrived after `round` closed and wait for the next one (an elastic job's growth).
  virtual int nodes_waiting(int round) = 0;
  // Moves the job from `round` to the next one (idempotent across agents), whose NodeAssignment
  // will carry `restarts`: the failed rounds so far. After a loss, `survivors` is how many of
  // the round's nodes remain: the next round closes once they are all in, with no last call.
  // `quorum` > 0: the next round closes only with that many nodes, and fails after a while
  // without them (a node lost by its heartbeat may be this side's partition: rendezvous.h).
  // `members` > 0: the next round closes as soon as that many nodes joined (a growth whose
  // workers regrouped in-process, and wait idle: the round's nodes and those waiting), else at
  // its last call as any growth.
  virtual void advance(int round, int restarts, std::optional<int> survivors, int quorum,
                       int members = 0) = 0;
  // The store's host left or vanished: moves the store (above) and returns true once this node
  // has a store again, for join() to go on from; false when it cannot (another backend, a job
  // of fixed size, no round yet, this node hosted it). `restarts`: the failed rounds so far.
  virtual bool fail_over(int restarts) = 0;
  // The round ended because the store's host is leaving (signalled; it said so): moves the store
  // at once, as fail_over does but with no majority needed, rather than forming the next round
  // on a store about to go. False when `cause` is not that, or the store cannot move.
  virtual bool move_store_from_leaving_host(const FailureReport& cause, int restarts) = 0;
  // Exit barrier after this node's workers all succeeded: waits for the other nodes, up to the
  // exit barrier timeout. Returns the round's failure if one is published meanwhile.
  virtual std::optional<FailureReport> finish(int round, int nodes) = 0;
  // Before leaving after a failure, the store's host waits (bounded) until every node has read
  // the final root cause (settled) or at least seen the failure (stopped), so that none loses
  // the store before.
  virtual void linger_until_settled(int round, int nodes) = 0;
  virtual void linger_until_stopped(int round, int nodes) = 0;
  // The round's keys under `topic` (e.g. the hang diagnosis's, hang_watch.h).
  virtual std::shared_ptr<ddp::Store> round_store(int round, const std::string& topic) = 0;
  // The same, on the connection the agent monitors the round with while its workers run, whose
  // requests give up after the heartbeat limit (so a silent store's host cannot block it).
  virtual std::shared_ptr<ddp::Store> monitor_store(int round, const std::string& topic) = 0;
};

}  // namespace ddprun
