// Unit test of lib/src/comm/topology.cpp: Topology from the ranks' node keys (node numbering,
// local ranks, members, uniformity, the one-line summary, bad ranks), node_key from this host's
// identity, and exchange_topology over a store on loopback (single rank, ranks as threads, other
// nodes' keys, and a second exchange over the same store).
#include "ddp/comm/topology.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <climits>
#include <exception>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "ddp/error.h"
#include "ddp/store.h"
#include "scoped_env.h"

namespace ddp {
namespace {

using namespace std::chrono_literals;

TEST(Topology, TheDefaultIsOneNodeOfOneRank) {
  const Topology t;
  EXPECT_EQ(t.rank(), 0);
  EXPECT_EQ(t.size(), 1);
  EXPECT_EQ(t.nodes(), 1);
  EXPECT_EQ(t.node(), 0);
  EXPECT_EQ(t.local_rank(), 0);
  EXPECT_EQ(t.local_size(), 1);
  EXPECT_EQ(t.members(0), (std::vector<int>{0}));
  EXPECT_TRUE(t.uniform());
  EXPECT_EQ(t.describe(), "1 node × 1 rank");
}

TEST(Topology, NodesAreNumberedByTheirLowestRankAndRanksByGlobalRank) {
  const std::vector<std::string> keys{"x", "y", "x", "z", "y", "x"};
  const Topology t(keys, 3);
  EXPECT_EQ(t.size(), 6);
  EXPECT_EQ(t.nodes(), 3);
  const std::vector<int> node_of{0, 1, 0, 2, 1, 0};
  const std::vector<int> local_rank_of{0, 0, 1, 0, 1, 2};
  for (int r = 0; r < 6; ++r) {
    EXPECT_EQ(t.node_of(r), node_of[r]) << "rank " << r;
    EXPECT_EQ(t.local_rank_of(r), local_rank_of[r]) << "rank " << r;
  }
  EXPECT_EQ(t.members(0), (std::vector<int>{0, 2, 5}));
  EXPECT_EQ(t.members(1), (std::vector<int>{1, 4}));
  EXPECT_EQ(t.members(2), (std::vector<int>{3}));
  EXPECT_EQ(t.local_size_of(0), 3);
  EXPECT_EQ(t.local_size_of(1), 2);
  EXPECT_EQ(t.local_size_of(2), 1);
  // This process is rank 3: alone on node 2.
  EXPECT_EQ(t.rank(), 3);
  EXPECT_EQ(t.node(), 2);
  EXPECT_EQ(t.local_rank(), 0);
  EXPECT_EQ(t.local_size(), 1);
  EXPECT_FALSE(t.uniform());
  EXPECT_EQ(t.describe(), "3 nodes × 1-3 ranks (uneven)");
}

TEST(Topology, EvenNodesAreUniform) {
  const Topology t({"a", "a", "a", "b", "b", "b"}, 4);
  EXPECT_TRUE(t.uniform());
  EXPECT_EQ(t.node(), 1);
  EXPECT_EQ(t.local_rank(), 1);
  EXPECT_EQ(t.local_size(), 3);
  EXPECT_EQ(t.describe(), "2 nodes × 3 ranks");
}

TEST(Topology, TheSummaryNamesTheSmallestAndLargestNode) {
  // The first node is the larger one here; the range still goes from small to large.
  EXPECT_EQ(Topology({"a", "a", "a", "b", "b"}, 0).describe(), "2 nodes × 2-3 ranks (uneven)");
  EXPECT_EQ(Topology({"a", "b"}, 1).describe(), "2 nodes × 1 rank");
  EXPECT_EQ(Topology({"a", "a"}, 1).describe(), "1 node × 2 ranks");
}

TEST(Topology, EmptyKeysAreAKeyLikeAnyOther) {
  // What a communicator assumes before its backend connects: one node holding every rank.
  const Topology t(std::vector<std::string>(3), 2);
  EXPECT_EQ(t.nodes(), 1);
  EXPECT_EQ(t.local_rank(), 2);
  EXPECT_EQ(t.describe(), "1 node × 3 ranks");
}

TEST(Topology, ARankOutsideTheKeysIsAConfigError) {
  try {
    Topology({"a", "b"}, 2);
    ADD_FAILURE() << "no error for rank 2 of 2";
  } catch (const ConfigError& e) {
    EXPECT_STREQ(e.what(), "topology: rank 2 outside [0, 2)");
  }
  EXPECT_THROW(Topology({"a", "b"}, -1), ConfigError);
  EXPECT_THROW(Topology({}, 0), ConfigError);
}

std::string first_line_of(const char* path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

std::string link_of(const char* path) {
  char buffer[PATH_MAX];
  const ssize_t n = ::readlink(path, buffer, sizeof(buffer));
  return n > 0 ? std::string(buffer, static_cast<std::size_t>(n)) : std::string();
}

TEST(NodeKey, IsHostnameBootIdAndNamespaces) {
  testing::ScopedEnv env("DDP_TEST_HOST_ID", nullptr);
  char hostname[HOST_NAME_MAX + 1] = {0};
  ASSERT_EQ(::gethostname(hostname, sizeof(hostname) - 1), 0);
  const std::string expected = std::string(hostname) + "/" +
                               first_line_of("/proc/sys/kernel/random/boot_id") + "/" +
                               link_of("/proc/self/ns/pid") + "/" + link_of("/proc/self/ns/ipc");
  EXPECT_EQ(detail::node_key(), expected);
  EXPECT_EQ(detail::node_key(), detail::node_key());
}

TEST(ExchangeTopology, ASingleRankNeedsNoStore) {
  testing::ScopedEnv env("DDP_TEST_HOST_ID", "solo");
  auto store = Store::host(0, 5s);
  const int64_t keys_before = store->num_keys();
  const Topology t = detail::exchange_topology(*store, 0, 1);
  EXPECT_EQ(store->num_keys(), keys_before);
  EXPECT_EQ(t.size(), 1);
  EXPECT_EQ(t.describe(), "1 node × 1 rank");
}

TEST(ExchangeTopology, RanksOnOneHostFindThemselvesOnOneNode) {
  testing::ScopedEnv env("DDP_TEST_HOST_ID", "pod-a");
  auto server = Store::host(0, 10s);
  constexpr int kRanks = 3;
  std::vector<Topology> topologies(kRanks);
  std::vector<std::exception_ptr> errors(kRanks);
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      try {
        auto client = Store::connect("127.0.0.1", server->port(), 10s);
        topologies[r] = detail::exchange_topology(*client, r, kRanks);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_FALSE(errors[r]) << "rank " << r << " failed";
    EXPECT_EQ(topologies[r].rank(), r);
    EXPECT_EQ(topologies[r].size(), kRanks);
    EXPECT_EQ(topologies[r].local_rank(), r);
    EXPECT_EQ(topologies[r].describe(), "1 node × 3 ranks");
  }
}

// The other ranks' keys are published by hand, under the names exchange_topology uses: each
// exchange over a store takes the next instance number, and publishes under
// "topology/<instance>/<rank>".
TEST(ExchangeTopology, OtherNodesKeysMakeOtherNodesAndEachExchangeReadsItsOwn) {
  testing::ScopedEnv env("DDP_TEST_HOST_ID", "n0");
  auto store = Store::host(0, 5s);
  store->set("topology/1/1", "test:n1");
  store->set("topology/1/2", "test:n0");
  const Topology first = detail::exchange_topology(*store, 0, 3);
  EXPECT_EQ(store->get("topology/1/0"), "test:n0");
  EXPECT_EQ(first.nodes(), 2);
  EXPECT_EQ(first.members(0), (std::vector<int>{0, 2}));
  EXPECT_EQ(first.members(1), (std::vector<int>{1}));
  EXPECT_EQ(first.describe(), "2 nodes × 1-2 ranks (uneven)");

  // A second communicator over the same store: the first one's keys do not leak into it.
  store->set("topology/2/1", "test:n0");
  store->set("topology/2/2", "test:n0");
  const Topology second = detail::exchange_topology(*store, 0, 3);
  EXPECT_EQ(second.nodes(), 1);
  EXPECT_EQ(second.describe(), "1 node × 3 ranks");
}

}  // namespace
}  // namespace ddp
