#pragma once
// Collectives over two levels of transports, for N nodes of L ranks each: `local` joins the L
// ranks of this node (shared memory), `cross` the N ranks that have this rank's local index, one
// per node (the network). Each level runs the flat algorithms of collectives.h with its own
// configuration. Against a flat ring over all N·L ranks, an allreduce puts 2(N-1)/N·S bytes on
// each node's link instead of 2(NL-1)/(NL)·S, in L flows per pair of nodes instead of one, and
// takes 2(N-1) network steps instead of 2(NL-1).
//
// Every rank of the job must make the same choice between these and the flat collectives
// (decide_hierarchy, from the topology all ranks share and DDP_COLLECTIVES).
#include <cstddef>
#include <string>

#include "comm/collectives/algorithm_config.h"
#include "comm/collectives/peer_transport.h"
#include "ddp/comm/topology.h"
#include "ddp/comm/types.h"

namespace ddp::detail::collectives {

// DDP_COLLECTIVES=auto|flat|hierarchical (default auto).
using ddp::CollectivesMode;
// options.collectives, else DDP_COLLECTIVES, else kAuto.
CollectivesMode collectives_mode(const CommOptions& options);

struct HierarchyDecision {
  bool hierarchical = false;
  // Why, for the log: "2 nodes × 2 ranks", "one node", "uneven nodes (...)",
  // "DDP_COLLECTIVES=flat".
  std::string reason;
  // Worth a warning: hierarchical was asked for (or would have paid) but cannot run.
  bool fell_back = false;
};

// Hierarchical where the ranks span more than one node with more than one rank on each and
// every node holds as many ranks; flat otherwise, or when `mode` says so.
HierarchyDecision decide_hierarchy(const Topology& topology, CollectivesMode mode);

// How the collectives run, for the log: "hierarchical (shm inside nodes, tcp;ofi_rxm between
// them)" with the two levels' transports, or "flat (one node)".
std::string describe(const HierarchyDecision& decision, const std::string& inside,
                     const std::string& between);

// The reduction of every step but the one that completes a result: kAvg sums, and that last
// step divides.
inline ReduceOp partial_reduction(ReduceOp op) {
  return op == ReduceOp::kAvg ? ReduceOp::kSum : op;
}

struct Hierarchy {
  PeerTransport& local;  // this node's ranks, in local-rank order
  PeerTransport& cross;  // the ranks with this local index, in node order
  const AlgorithmConfig& local_config;
  const AlgorithmConfig& cross_config;
};

// Below the cross level's slice_from_bytes an allreduce reduces the whole buffer inside the node,
// then every local rank allreduces all of it with its counterparts (the L groups in parallel, no
// third step); from it up the node reduce-scatters, each rank allreduces its 1/L slice across
// nodes, and the node allgathers.
// Same contract as collectives::allreduce; kAvg divides once, fused into the step that completes
// each element, so the result is the flat one (bit for bit with integer-valued data).
//
// A sliced allreduce of at least two pieces (pipeline_pieces) runs in pieces (at most
// AlgorithmConfig::kMaxPieces): a second thread takes each piece across nodes while this one
// reduce-scatters the next piece inside the node and allgathers the previous one, so the node's
// two steps hide behind the network's but for the first and the last piece.
void allreduce_hierarchical(const Hierarchy& h, Buffer buffer, ReduceOp op);
// How many pieces that pipeline cuts a `bytes` buffer into across `nodes` nodes (1: no
// pipeline). A piece is piece_bytes per node it is sent to, (N-1)·piece_bytes: with 1 MiB, 2 nodes
// cross in 0.5 MiB slices that gloo sends in one round each, while 4 nodes' ring over 1 MiB
// pieces spent more on its 6 steps per piece than the overlap saved (77 % of the link against
// 88-91 % for 4 MiB pieces or none, bench/results/2026-11-29-hierarchy-pipeline.txt).
std::size_t pipeline_pieces(const AlgorithmConfig& cross_config, std::size_t bytes, int nodes);
// Whether an allgather whose output holds `output_bytes`, or a reduce-scatter whose input does,
// takes the two-level path: from the cross level's slice_from_bytes up, as for the allreduce's
// slices; below it the flat collective's one round costs less than two.
bool gathers_hierarchically(const Hierarchy& h, std::size_t output_bytes);
// Each rank's input goes across nodes to its counterparts (allgather among the ranks with its
// local index: N blocks), then the node allgathers those rows (N·L blocks), which are copied to
// the output in the job's rank order (`topology`: which rank is local rank l of node n). A node's
// link carries (N-1)·L blocks out, against (N·L-1) on the flat ring's one crossing.
void allgather_hierarchical(const Hierarchy& h, const Topology& topology, Buffer input,
                            Buffer output);
// The mirror image: the input's blocks are arranged by local rank, the node reduce-scatters them
// so that each local rank holds its N counterparts' blocks summed over the node, and those N
// blocks are reduce-scattered across nodes. Same contract as collectives::reduce_scatter, kAvg
// dividing once in the last step.
void reduce_scatter_hierarchical(const Hierarchy& h, const Topology& topology, Buffer input,
                                 Buffer output, ReduceOp op);
// The root's counterparts get the buffer across nodes, then every node broadcasts it inside.
void broadcast_hierarchical(const Hierarchy& h, Buffer buffer, int root_node, int root_local_rank);
// Inside the node, then across: a rank leaves the cross barrier only after every rank of every
// node has entered the local one.
void barrier_hierarchical(const Hierarchy& h);

}  // namespace ddp::detail::collectives
