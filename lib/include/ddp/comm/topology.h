#pragma once
// Which ranks share a node: a pod, or any set of processes that can use shared memory with each
// other (same kernel, hostname, pid and IPC namespaces). Every communicator learns it from the
// rendezvous when it connects, so every rank holds the same Topology. Nodes are numbered in the
// order of their lowest rank; within a node, ranks are ordered by global rank, which is what
// torchrun's GROUP_RANK and LOCAL_RANK mean when ranks are assigned node by node.
#include <string>
#include <vector>

namespace ddp {

class Store;

class Topology {
 public:
  // One node of one rank.
  Topology() : Topology({std::string()}, 0) {}
  // From each rank's node key (equal keys: the same node); `rank` is this process's rank.
  Topology(const std::vector<std::string>& node_keys, int rank);

  int rank() const { return rank_; }
  int size() const { return static_cast<int>(node_of_.size()); }
  int nodes() const { return static_cast<int>(members_.size()); }
  // This rank's node and its index there.
  int node() const { return node_of_[rank_]; }
  int local_rank() const { return local_rank_of(rank_); }
  int local_size() const { return local_size_of(node()); }

  int node_of(int rank) const { return node_of_[rank]; }
  int local_rank_of(int rank) const;
  int local_size_of(int node) const { return static_cast<int>(members_[node].size()); }
  // The global ranks on `node`, ascending.
  const std::vector<int>& members(int node) const { return members_[node]; }
  // Every node holds the same number of ranks.
  bool uniform() const;

  // "4 nodes × 8 ranks", "1 node × 2 ranks", "3 nodes × 1-2 ranks (uneven)".
  std::string describe() const;

 private:
  int rank_ = 0;
  std::vector<int> node_of_;
  std::vector<int> local_rank_;
  std::vector<std::vector<int>> members_;
};

namespace detail {

// This process's node key: hostname, boot id, pid and IPC namespaces. DDP_TEST_HOST_ID, when
// set, replaces it (tests only: it lets one machine play several nodes).
std::string node_key();

// Every rank publishes its node key under `store` and reads all of them: four store round trips
// per rank (a counter, a set, one wait for all keys, one multi-get), however many ranks there are.
Topology exchange_topology(Store& store, int rank, int size);

}  // namespace detail
}  // namespace ddp
