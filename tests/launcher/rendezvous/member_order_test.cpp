// The order of a round's members (launcher/rendezvous/member_order.h): claimed node ranks, then the
// previous round's, then host names in natural order; join order only among agents of one host.
#include "rendezvous/member_order.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace ddprun {
namespace {

std::vector<std::string> hosts_in_order(std::vector<RoundMember> members) {
  order_members(members);
  std::vector<std::string> hosts;
  for (const RoundMember& m : members) hosts.push_back(m.host);
  return hosts;
}

TEST(MemberOrder, NaturalOrderComparesDigitRunsByValue) {
  EXPECT_TRUE(natural_less("pod-2", "pod-10"));
  EXPECT_FALSE(natural_less("pod-10", "pod-2"));
  EXPECT_TRUE(natural_less("job-1.svc", "job-1x"));
  EXPECT_TRUE(natural_less("pod", "pod-0"));
  EXPECT_TRUE(natural_less("10.0.0.9", "10.0.0.10"));
  EXPECT_TRUE(natural_less("a9b", "a10a"));
  EXPECT_FALSE(natural_less("pod-1", "pod-1"));
  // Equal by value: a fixed order all the same, one way only.
  EXPECT_NE(natural_less("pod-02", "pod-2"), natural_less("pod-2", "pod-02"));
}

TEST(MemberOrder, HostsWithoutARankFollowTheirNamesNotTheirJoinOrder) {
  // pod-1 reached the store first, pod-10 second: the order is still by name.
  const std::vector<RoundMember> members = {{1, -1, -1, 1, "pod-1"},
                                            {2, -1, -1, 1, "pod-10"},
                                            {3, -1, -1, 1, "pod-2"},
                                            {4, -1, -1, 1, "pod-0"}};
  EXPECT_EQ(hosts_in_order(members),
            (std::vector<std::string>{"pod-0", "pod-1", "pod-2", "pod-10"}));
}

TEST(MemberOrder, ClaimedRanksFirstThenThePreviousRoundThenNames) {
  const std::vector<RoundMember> members = {{1, -1, -1, 1, "a-0"},  // new, no rank
                                            {2, -1, 1, 1, "z-9"},   // was group rank 1
                                            {3, 5, -1, 1, "m-5"},   // claims node rank 5
                                            {4, -1, 0, 1, "y-8"},   // was group rank 0
                                            {5, 2, -1, 1, "m-2"}};  // claims node rank 2
  EXPECT_EQ(hosts_in_order(members), (std::vector<std::string>{"m-2", "m-5", "y-8", "z-9", "a-0"}));
}

TEST(MemberOrder, AgentsSharingAHostKeepTheirJoinOrder) {
  const std::vector<RoundMember> members = {
      {3, -1, -1, 1, "node"}, {1, -1, -1, 2, "node"}, {2, -1, -1, 4, "node"}};
  std::vector<RoundMember> ordered = members;
  order_members(ordered);
  ASSERT_EQ(ordered.size(), 3U);
  EXPECT_EQ(ordered[0].join_index, 1);
  EXPECT_EQ(ordered[1].join_index, 2);
  EXPECT_EQ(ordered[2].join_index, 3);
}

}  // namespace
}  // namespace ddprun
