#pragma once
// The rendezvous on the store: ddp::Store, served by ddp::StoreServer on the hosting agent
// (static, c10d), or by an etcd cluster (etcd-v2). Whatever the backend, each round's node 0
// serves that round's workers a store of their own (rendezvous.h).
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "rendezvous/rendezvous.h"

namespace ddp {
class Store;
class StoreServer;
}  // namespace ddp

namespace ddprun {

class StoreRendezvous : public Rendezvous {
 public:
  // Hosts the store (static: node 0; c10d: the agent on the endpoint's host) or connects to it,
  // retrying name resolution and connection until the join timeout. `poll_interrupt` is called
  // while waiting; it throws to abandon the wait (a signal).
  StoreRendezvous(const LaunchConfig& config, const HostFacts& host,
                  std::function<void()> poll_interrupt);
  ~StoreRendezvous() override;
  // Called on every turn of the waits that do not poll for signals (settling a failure,
  // lingering for the other nodes): the agent's progress for its health endpoint.
  void on_wait(std::function<void()> hook) { on_wait_ = std::move(hook); }

  const std::string& store_host() const override { return store_host_; }
  int store_port() const override { return store_port_; }
  WorkerStore worker_store() const override { return worker_store_; }
  NodeAssignment join() override;
  std::optional<FailureReport> failure(int round) override;
  FailureReport publish_failure(int round, const FailureReport& report) override;
  void revise_failure(int round, const FailureReport& before, const FailureReport& after) override;
  void stand_in_for_lost(int round, int group_rank) override;
  void acknowledge_stop(int round, bool leaving) override;
  FailureReport settle_failure(int round, int nodes, const FailureReport& fallback) override;
  // The store's host watches every node; with etcd, which no node hosts, every agent does.
  bool watches_heartbeats() const override { return hosts_store_ || etcd_; }
  std::chrono::milliseconds monitor_floor() const override { return poll_cap({}); }
  void beat(int round, int group_rank, int64_t delta) override;
  std::vector<int64_t> beats(int round, int nodes) override;
  std::string node_host(int round, int group_rank) override;
  int nodes_waiting(int round) override;
  void advance(int round, int restarts, std::optional<int> survivors, int quorum,
               int members = 0) override;
  bool fail_over(int restarts) override;
  bool move_store_from_leaving_host(const FailureReport& cause, int restarts) override;
  std::optional<FailureReport> finish(int round, int nodes) override;
  void linger_until_settled(int round, int nodes) override;
  void linger_until_stopped(int round, int nodes) override;
  std::shared_ptr<ddp::Store> round_store(int round, const std::string& topic) override;
  std::shared_ptr<ddp::Store> monitor_store(int round, const std::string& topic) override;

 private:
  // join() on the current store: the job's round, and the next ones while this node is late.
  NodeAssignment join_current();
  NodeAssignment try_join(int round, std::chrono::steady_clock::time_point deadline, bool& late);
  // Until the round closes: at the maximum node count; once the survivors of a loss are all in
  // (advance's `survivors`); or last_call_timeout after the minimum was reached.
  void wait_until_closed(int round, std::chrono::steady_clock::time_point start,
                         std::chrono::steady_clock::time_point deadline);
  void report_waiting(int round, int joined, bool min_reached,
                      std::chrono::steady_clock::time_point start);
  // The round-scoped count `k`, or `fallback` when it was never written.
  int count_or(const std::string& k, int fallback);
  // Whether the round's survivors of the previous one number `expected` (> 0) yet.
  bool survivors_in(int round, int expected, int joined);
  // The round's first joiner: orders the `closed` members and writes each one's place (or the
  // round's configuration error) under round<R>/place/<join index>.
  void assign_places(int round, int closed);
  void connect_with_retry(std::chrono::steady_clock::time_point deadline);
  // One attempt of it: "" once connected (or hosting, or at a moved store), else why not.
  std::string try_connect(std::chrono::steady_clock::time_point deadline,
                          std::chrono::steady_clock::time_point& next_peer_look);
  // Store failover (rendezvous.h): moves the store; the next round needs `quorum` nodes.
  bool move_store(int restarts, int quorum);
  // Whether the store of this node's last round stopped answering.
  bool store_gone() const;
  // Waits until `address` serves the store, up to `deadline`, and connects this agent to it.
  bool reach_store_at(const std::string& address, std::chrono::steady_clock::time_point deadline);
  // Connects this agent to the store at `address` (the store's port): true, or false with the
  // agent's store left as it was. Throws JoinRefusedError (retrying cannot help).
  bool connect_store_at(const std::string& address, std::chrono::steady_clock::time_point deadline);
  // The next round on the moved store: round, restarts, survivors and the majority it needs.
  void seed_round_after_move(int restarts, int survivors, int quorum);
  // How long the survivors wait for a node to take the store over before trying the next.
  std::chrono::milliseconds failover_window() const;
  // The job's live store at one of the store peers (rdzv-conf store_peers): connects to it and
  // returns true, else false at once.
  bool find_moved_store();
  // While an agent that serves a store waits alone in its first round: every kPeerLookEvery,
  // whether the job's store lives elsewhere (it came up before the survivors moved it there);
  // if so, gives up its own and connects there (join() then joins there).
  bool leave_for_moved_store(std::chrono::steady_clock::time_point& next_look);
  struct MovedAway {};  // thrown out of a round's wait by leave_for_moved_store
  // The round's members' addresses as the others reach them, and who hosts the store.
  void note_round_members(int round);
  // Serves the rendezvous store on the endpoint's port: true when it does; false (logged) when
  // another agent holds the port and may_host_ allows joining it; else throws.
  bool try_host();
  std::shared_ptr<ddp::Store> open_store(std::chrono::steady_clock::time_point deadline);
  // The round's node 0 serves the round's workers a fresh store (or picks worker rank 0's port);
  // every node learns where.
  void settle_worker_store(const NodeAssignment& node);
  // On the store's host: from now on the agents' store admits by address only the workers of
  // the round's members that are not lost (their agents' addresses as the store saw them).
  void admit_round_members(int round);
  // Hands the store member_addresses_ (less the empty ones: lost, or no token presented).
  void admit_member_addresses();
  // Closes this node's round's workers' store and its connection to node 0's.
  void release_worker_store();
  // Where this agent is reached by the other nodes: on the store's host the store's address, else
  // --local-addr or the address that routes to the store. Node 0's also is its workers'
  // MASTER_ADDR.
  std::string worker_store_address() const;
  std::chrono::milliseconds heartbeat_limit() const;
  // Runs fn on the monitoring connection (the store's own on its host and with etcd); a request
  // that went unanswered for the heartbeat limit is reported as the store's host vanishing.
  template <typename Fn>
  auto monitored(Fn&& fn) -> decltype(fn(std::declval<ddp::Store&>()));
  std::string where() const;
  // The longest pause between two polls: `tcp_cap`, or longer with etcd.
  std::chrono::milliseconds poll_cap(std::chrono::milliseconds tcp_cap) const;
  // Rounds before `round` that ended in a failure rather than a membership change.
  int restarts_before(int round);
  std::string key(int round, const std::string& name) const;
  // Waits until the round's counter `name` reaches `target` or `deadline` passes.
  void wait_for_count(int round, const std::string& name, int target,
                      std::chrono::steady_clock::time_point deadline);

  const LaunchConfig& config_;
  const HostFacts& host_;
  std::function<void()> poll_interrupt_;
  std::function<void()> on_wait_;
  std::shared_ptr<ddp::StoreServer> agents_server_;  // the agents' store, on its host
  std::shared_ptr<ddp::Store> server_;               // its host's client of it
  std::vector<std::string> member_addresses_;  // the round's, by group rank ("": lost or local)
  std::shared_ptr<ddp::Store> store_;          // this agent's view, prefixed by the run id
  bool hosts_store_ = false;
  bool may_host_ = false;  // c10d on the endpoint's machine, no rank or is_host naming it
  bool said_not_host_ = false;
  bool etcd_ = false;
  // A TCP store's non-hosting agents monitor the round (beat, failure, nodes waiting) through
  // a connection of their own whose requests give up after the heartbeat limit.
  std::shared_ptr<ddp::Store> monitor_store_;
  std::shared_ptr<ddp::Store> worker_server_;  // the round's workers' store (round's node 0)
  std::shared_ptr<ddp::Store> worker_client_;  // this node's connection to it (admits workers)
  WorkerStore worker_store_;
  std::string store_host_;
  int store_port_ = 0;
  int preferred_rank_ = -1;  // group rank from the previous round, for nodes without a rank
  int last_round_ = -1;      // the last round this node had a place in
  // That round's members' addresses (worker_store_address) by group rank, and the group rank
  // whose agent hosted the store: where the store moves when its host is gone.
  std::vector<std::string> reach_;
  int store_host_rank_ = -1;
  int next_restarts_ = 0;  // what advance() carried to the next round
};

}  // namespace ddprun
