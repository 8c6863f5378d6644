#pragma once
// The order of a round's members, which fixes every node's group rank and so every worker's
// global rank. Apart from the store so that it is unit-tested
// (tests/launcher/rendezvous/member_order_test.cpp).
//
// 1. Nodes that claim a node rank (--node-rank, a pod index) come first, in that order.
// 2. Then nodes without one that were in the previous round, in their previous order, so a new
//    round keeps the survivors' ranks.
// 3. Then the rest by host name in natural order (digits compare as numbers: pod-2 before
//    pod-10), like torchrun's c10d rendezvous, which sorts by host; unlike torchrun, `job-10`
//    does not come before `job-2`. Join order only breaks ties (agents sharing one host), so
//    ranks do not depend on which agent reached the store first.
#include <string>
#include <string_view>
#include <vector>

namespace ddprun {

struct RoundMember {
  int join_index = 0;  // 1-based, in the order the agents joined
  int node_rank = -1;  // claimed by configuration; -1: none
  int preferred = -1;  // group rank in the previous round; -1: none
  int nproc = 1;
  std::string host;
};

// Whether `a` sorts before `b` with runs of digits compared by value ("pod-2" < "pod-10").
bool natural_less(std::string_view a, std::string_view b);

// Sorts `members` into group-rank order (above). Stable for equal keys.
void order_members(std::vector<RoundMember>& members);

}  // namespace ddprun
