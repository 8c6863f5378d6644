// What the gloo backend adds to the conformance suite: every DDP_ALGORITHM gives exact results at
// sizes that take each of gloo's paths (a round inside the exchange mesh's messages, a round with
// the payloads beside them, the ring), and a disagreement on a large collective, whose data runs
// over the ring, is reported as the mismatch it is (not as a timeout), after which the
// communicator refuses further work.
#include <chrono>
#include <cstdlib>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "comm/transport_communicator.h"
#include "ddp/comm/factory.h"
#include "ddp/error.h"
#include "multiprocess.h"

namespace ddp {
namespace {

using namespace std::chrono_literals;
using testing::require;

// One size for each way the backend moves data, odd so blocks and chunks are uneven: inside the
// direct exchange (up to 64 KiB); in the payload exchange beside it (up to 512 KiB per payload
// on 3 ranks); the ring (~7 MiB gives 3 ranks ring blocks of three chunks).
constexpr std::size_t kSmallFloats = 1001;
constexpr std::size_t kMidFloats = 100003;
constexpr std::size_t kLargeFloats = (7u << 20) / 4 + 13;

testing::TestStoreServer& server() {
  static testing::TestStoreServer instance;
  return instance;
}

CommOptions with_timeout(std::chrono::milliseconds timeout) {
  CommOptions options;
  options.timeout = timeout;
  return options;
}

// Exact results of every collective on `n` floats (n may be 0, or below the world size, where
// the ring sends empty messages).
void check_every_collective(Communicator& comm, std::size_t n) {
  const int size = comm.size();
  const int rank = comm.rank();
  const std::string where = " of " + std::to_string(n) + " floats";
  std::vector<float> data(n);
  for (std::size_t i = 0; i < n; ++i) data[i] = static_cast<float>((rank + 1) * (i % 5 + 1));
  comm.allreduce(data, ReduceOp::kSum);
  for (std::size_t i = 0; i < n; ++i) {
    require(data[i] == static_cast<float>(size * (size + 1) / 2 * (i % 5 + 1)),
            "allreduce" + where + " wrong at " + std::to_string(i));
  }
  std::vector<float> avg(n, static_cast<float>(2 * rank));
  comm.allreduce(avg, ReduceOp::kAvg);
  for (float v : avg) require(v == static_cast<float>(size - 1), "allreduce avg" + where);

  std::vector<float> root_data(n, static_cast<float>(rank));
  comm.broadcast(root_data, size - 1);
  for (float v : root_data) require(v == size - 1, "broadcast" + where);

  std::vector<float> mine(n, static_cast<float>(rank)), all(n * size);
  comm.allgather(mine, all);
  for (std::size_t i = 0; i < all.size(); ++i) {
    require(all[i] == static_cast<float>(i / n), "allgather" + where);
  }

  std::vector<float> whole(n * size, 1.0f), block(n);
  comm.reduce_scatter(whole, block, ReduceOp::kSum);
  for (float v : block) require(v == size, "reduce_scatter" + where);
}

class GlooAlgorithm : public ::testing::TestWithParam<const char*> {};

TEST_P(GlooAlgorithm, EveryCollectiveIsExactAtEverySize) {
  const std::string algorithm = GetParam();
  const std::string prefix = server().next_group_prefix();
  auto outcomes = testing::run_ranks(3, 120s, [&](int rank) {
    setenv("DDP_ALGORITHM", algorithm.c_str(), 1);
    auto comm =
        create_communicator("gloo", server().connect_client(prefix), rank, 3, with_timeout(20s));
    for (std::size_t n :
         {std::size_t{0}, std::size_t{1}, std::size_t{2}, kSmallFloats, kMidFloats, kLargeFloats}) {
      check_every_collective(*comm, n);
    }
  });
  EXPECT_TRUE(testing::all_ranks_succeeded(outcomes)) << "DDP_ALGORITHM=" << algorithm;
}

INSTANTIATE_TEST_SUITE_P(Gloo, GlooAlgorithm,
                         ::testing::Values("auto", "direct", "ring", "recursive_doubling"),
                         [](const auto& info) { return std::string(info.param); });

// Two nodes of two ranks (DDP_TEST_HOST_ID) where libddp_fabric cannot open a transport
// inside the node: the node level falls back to gloo's own pairs, and every collective is still
// exact at every size.
TEST(GlooBackend, HierarchicalOnGlooPairsWhereTheFabricModuleCannotServeTheNode) {
  const std::string prefix = server().next_group_prefix();
  auto outcomes = testing::run_ranks(4, 120s, [&](int rank) {
    setenv("DDP_TEST_HOST_ID", rank < 2 ? "node0" : "node1", 1);
    setenv("DDP_FABRIC_PROVIDER", "no-such-provider", 1);
    auto comm =
        create_communicator("gloo", server().connect_client(prefix), rank, 4, with_timeout(20s));
    require(comm->hierarchical(), "collectives are flat on " + comm->topology().describe());
    for (std::size_t n :
         {std::size_t{0}, std::size_t{1}, std::size_t{2}, kSmallFloats, kMidFloats, kLargeFloats}) {
      check_every_collective(*comm, n);
    }
  });
  EXPECT_TRUE(testing::all_ranks_succeeded(outcomes));
}

TEST(GlooBackend, LargeMismatchIsReportedAsSuchAndPoisonsTheCommunicator) {
  // Ranks 0 and 1 agree; rank 2 passes one element more. The op's timeout is far away, so a
  // TimeoutError would mean the disagreement went unnoticed until the peers gave up.
  const std::string prefix = server().next_group_prefix();
  auto outcomes = testing::run_ranks(3, 60s, [&](int rank) {
    auto comm =
        create_communicator("gloo", server().connect_client(prefix), rank, 3, with_timeout(15s));
    std::vector<float> data(kLargeFloats + (rank == 2 ? 1 : 0), 1.0f);
    try {
      comm->allreduce(data, ReduceOp::kSum);
      require(false, "allreduce with mismatched sizes did not fail");
    } catch (const TimeoutError& e) {
      require(false, std::string("the mismatch surfaced only as a timeout: ") + e.what());
    } catch (const CommError& e) {
      const std::string what = e.what();
      const std::string other = rank == 2 ? "x " + std::to_string(kLargeFloats) + ","
                                          : "x " + std::to_string(kLargeFloats + 1) + ",";
      require(what.find("issued allreduce(sum, float32 " + other) != std::string::npos,
              "the error does not describe the other rank's call: " + what);
    }
    std::vector<float> after(4, 1.0f);
    try {
      comm->allreduce(after, ReduceOp::kSum);
      require(false, "the communicator still ran a collective after a failed large one");
    } catch (const CommError& e) {
      require(std::string(e.what()).find("unusable") != std::string::npos, e.what());
    }
  });
  EXPECT_TRUE(testing::all_ranks_succeeded(outcomes));
}

TEST(GlooBackend, RanksWithDifferentAlgorithmSettingsFailClearly) {
  // Rank 0 would run the ring, rank 1 one round: without the check rank 1 would reduce a payload
  // rank 0 never sent.
  const std::string prefix = server().next_group_prefix();
  auto outcomes = testing::run_ranks(2, 60s, [&](int rank) {
    setenv("DDP_ALGORITHM", rank == 0 ? "ring" : "auto", 1);
    auto comm =
        create_communicator("gloo", server().connect_client(prefix), rank, 2, with_timeout(15s));
    std::vector<float> data(100, 1.0f);
    try {
      comm->allreduce(data, ReduceOp::kSum);
      require(false, "allreduce across different DDP_ALGORITHM settings succeeded");
    } catch (const TimeoutError& e) {
      require(false, std::string("the disagreement surfaced only as a timeout: ") + e.what());
    } catch (const CommError& e) {
      require(std::string(e.what()).find("DDP_ALGORITHM") != std::string::npos, e.what());
    }
  });
  EXPECT_TRUE(testing::all_ranks_succeeded(outcomes));
}

// An allreduce leaves the round at 1 MiB sent per rank (payload x peers) for the ring, or, with
// two ranks on two nodes, for one exchange of the whole buffer; both sides of that line give
// exact results.
TEST(GlooBackend, AllreduceLeavesTheRoundAtOneMiBSentPerRank) {
  using detail::collectives::AllreduceAlgorithm;
  struct Case {
    int world;
    bool two_nodes;  // each rank its own node (DDP_TEST_HOST_ID)
    AllreduceAlgorithm past;
  };
  for (const Case c : {Case{2, false, AllreduceAlgorithm::kRing},
                       Case{2, true, AllreduceAlgorithm::kRecursiveDoubling},
                       Case{3, false, AllreduceAlgorithm::kRing}}) {
    const std::size_t ring_from = (std::size_t{1} << 20) / static_cast<std::size_t>(c.world - 1);
    const std::string prefix = server().next_group_prefix();
    auto outcomes = testing::run_ranks(c.world, 60s, [&](int rank) {
      unsetenv("DDP_ALGORITHM");
      if (c.two_nodes) setenv("DDP_TEST_HOST_ID", ("pod-" + std::to_string(rank)).c_str(), 1);
      auto comm = create_communicator("gloo", server().connect_client(prefix), rank, c.world,
                                      with_timeout(15s));
      auto* gloo = dynamic_cast<detail::TransportCommunicator*>(comm.get());
      require(gloo != nullptr, "the gloo backend is not a TransportCommunicator");
      require(gloo->allreduce_algorithm(ring_from - 4, ring_from / 4 - 1) ==
                  AllreduceAlgorithm::kDirect,
              "just below the line an allreduce does not take one round");
      require(gloo->allreduce_algorithm(ring_from, ring_from / 4) == c.past,
              c.two_nodes ? "at the line two ranks on two nodes do not exchange the whole buffer"
                          : "at the line an allreduce on one node does not take the ring");
      for (std::size_t n : {ring_from / 4 - 1, ring_from / 4}) check_every_collective(*comm, n);
    });
    EXPECT_TRUE(testing::all_ranks_succeeded(outcomes))
        << c.world << " ranks" << (c.two_nodes ? " on two nodes" : "");
  }
}

TEST(GlooBackend, UnknownOrReplacedAlgorithmSettingsAreConfigErrors) {
  const std::string prefix = server().next_group_prefix();
  auto outcomes = testing::run_ranks(1, 30s, [&](int rank) {
    struct Case {
      const char* variable;
      const char* value;
      const char* named_in_error;  // what the error must point the user to
    };
    for (const Case c : {Case{"DDP_ALGORITHM", "halving", "recursive_doubling"},
                         Case{"DDP_GLOO_ALGORITHM", "bcube", "DDP_ALGORITHM"}}) {
      setenv(c.variable, c.value, 1);
      const std::string setting = std::string(c.variable) + "=" + c.value;
      try {
        create_communicator("gloo", server().connect_client(prefix), rank, 1);
        require(false, setting + " was accepted");
      } catch (const ConfigError& e) {
        require(std::string(e.what()).find(c.named_in_error) != std::string::npos, e.what());
      }
      unsetenv(c.variable);
    }
  });
  EXPECT_TRUE(testing::all_ranks_succeeded(outcomes));
}

}  // namespace
}  // namespace ddp
