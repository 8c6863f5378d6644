// DistributedSampler: torch's sharding semantics, determinism, and bit-identical permutations to
// PyTorch's own DistributedSampler (checked against Debian's python3-torch when installed).
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "ddp/data/distributed_sampler.h"
#include "ddp/error.h"

namespace ddp::data {
namespace {

std::vector<std::vector<int64_t>> all_shards(int64_t n, int world, SamplerOptions options,
                                             int64_t epoch) {
  std::vector<std::vector<int64_t>> shards;
  for (int r = 0; r < world; ++r) {
    DistributedSampler s(n, world, r, options);
    s.set_epoch(epoch);
    shards.push_back(s.indices());
  }
  return shards;
}

TEST(DistributedSampler, EqualShardsThatCoverTheDatasetWithPadding) {
  for (int64_t n : {1, 2, 7, 10, 13, 100}) {
    for (int world : {1, 2, 3, 4}) {
      SCOPED_TRACE("n=" + std::to_string(n) + " world=" + std::to_string(world));
      const auto shards = all_shards(n, world, {}, 3);
      const auto per_rank = static_cast<std::size_t>((n + world - 1) / world);
      std::multiset<int64_t> seen;
      for (const auto& shard : shards) {
        EXPECT_EQ(shard.size(), per_rank);
        for (int64_t i : shard) {
          EXPECT_GE(i, 0);
          EXPECT_LT(i, n);
          seen.insert(i);
        }
      }
      for (int64_t i = 0; i < n; ++i) EXPECT_GE(seen.count(i), 1u) << "index " << i;
      EXPECT_EQ(seen.size(), per_rank * world);  // exactly the padding is repeated
    }
  }
}

TEST(DistributedSampler, DropLastGivesDisjointEqualShards) {
  for (int64_t n : {1, 7, 10, 13}) {
    for (int world : {2, 3, 4}) {
      SamplerOptions o;
      o.drop_last = true;
      const auto shards = all_shards(n, world, o, 0);
      std::set<int64_t> seen;
      for (const auto& shard : shards) {
        EXPECT_EQ(static_cast<int64_t>(shard.size()), n / world);
        for (int64_t i : shard) EXPECT_TRUE(seen.insert(i).second) << "duplicate " << i;
      }
    }
  }
}

TEST(DistributedSampler, RanksInterleaveOneSharedPermutation) {
  const auto shards = all_shards(12, 3, {}, 5);
  const auto whole = all_shards(12, 1, {}, 5)[0];
  for (int r = 0; r < 3; ++r) {
    for (std::size_t k = 0; k < shards[r].size(); ++k) EXPECT_EQ(shards[r][k], whole[k * 3 + r]);
  }
}

TEST(DistributedSampler, PermutationDependsOnSeedPlusEpochOnly) {
  DistributedSampler a(50, 2, 1);
  DistributedSampler b(50, 2, 1);
  a.set_epoch(4);
  b.set_epoch(4);
  EXPECT_EQ(a.indices(), b.indices());
  b.set_epoch(5);
  EXPECT_NE(a.indices(), b.indices());
  SamplerOptions seeded;
  seeded.seed = 1;
  DistributedSampler c(50, 2, 1, seeded);
  c.set_epoch(3);  // seed 1 + epoch 3 == seed 0 + epoch 4, as in torch
  EXPECT_EQ(a.indices(), c.indices());
}

TEST(DistributedSampler, WithoutShuffleRanksTakeStridedPositions) {
  SamplerOptions o;
  o.shuffle = false;
  DistributedSampler s(7, 3, 1, o);
  EXPECT_EQ(s.indices(), (std::vector<int64_t>{1, 4, 0}));  // 7 padded with index 0 to 9
}

TEST(DistributedSampler, RejectsInvalidRanks) {
  EXPECT_THROW(DistributedSampler(10, 2, 2), ConfigError);
  EXPECT_THROW(DistributedSampler(10, 0, 0), ConfigError);
  EXPECT_THROW(DistributedSampler(-1, 1, 0), ConfigError);
}

std::string run_python(const std::string& script, int* status) {
  std::string command = "/usr/bin/python3 -c '" + script + "' 2>/dev/null";
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) {
    *status = -1;
    return "";
  }
  std::string output;
  char buffer[4096];
  while (std::fgets(buffer, sizeof buffer, pipe)) output += buffer;
  *status = pclose(pipe);
  return output;
}

TEST(DistributedSampler, MatchesPyTorchExactly) {
  int status = 0;
  run_python("import torch.utils.data", &status);
  if (status != 0) {
    GTEST_SKIP() << "/usr/bin/python3 with torch is not available (apt-get install python3-torch)";
  }
  struct Case {
    int64_t n;
    int world;
    int rank;
    bool shuffle;
    bool drop_last;
    uint64_t seed;
    int64_t epoch;
  };
  const std::vector<Case> cases{{60000, 2, 0, true, false, 0, 0}, {60000, 2, 1, true, false, 0, 3},
                                {1001, 3, 2, true, false, 42, 7}, {1001, 3, 1, true, true, 42, 7},
                                {10, 4, 3, false, false, 0, 0},   {5, 8, 6, true, false, 1, 2}};
  std::ostringstream script;
  script << "import torch.utils.data as d\n"
            "class L:\n"
            "  def __init__(s, n): s.n = n\n"
            "  def __len__(s): return s.n\n";
  for (const auto& c : cases) {
    script << "s = d.DistributedSampler(L(" << c.n << "), num_replicas=" << c.world
           << ", rank=" << c.rank << ", shuffle=" << (c.shuffle ? "True" : "False")
           << ", seed=" << c.seed << ", drop_last=" << (c.drop_last ? "True" : "False") << ")\n"
           << "s.set_epoch(" << c.epoch << ")\n"
           << "print(\" \".join(map(str, s)))\n";
  }
  const std::string output = run_python(script.str(), &status);
  ASSERT_EQ(status, 0) << "python failed";
  std::istringstream lines(output);
  for (const auto& c : cases) {
    std::string line;
    ASSERT_TRUE(std::getline(lines, line));
    std::istringstream values(line);
    std::vector<int64_t> expected;
    for (int64_t v; values >> v;) expected.push_back(v);
    SamplerOptions o;
    o.shuffle = c.shuffle;
    o.drop_last = c.drop_last;
    o.seed = c.seed;
    DistributedSampler s(c.n, c.world, c.rank, o);
    s.set_epoch(c.epoch);
    EXPECT_EQ(s.indices(), expected) << "n=" << c.n << " world=" << c.world << " rank=" << c.rank;
  }
}

// An elastic job's epoch: 2 ranks train some batches, 3 ranks go on from where they stopped,
// then 1 rank finishes the epoch. Each continues at the offset the trainer computes from its
// checkpoint (positions consumed = offset + batches x batch x world), and every sample of the
// epoch is trained exactly once.
TEST(DistributedSampler, AWorldSizeChangeWithinAnEpochTrainsEachSampleOnce) {
  const int64_t n = 101;
  const int64_t batch = 4;
  struct Segment {
    int world;
    int64_t batches;  // per rank; -1: to the end of the epoch
  };
  for (const std::vector<Segment>& plan :
       {std::vector<Segment>{{2, 5}, {3, 3}, {1, -1}}, std::vector<Segment>{{3, 2}, {2, -1}},
        std::vector<Segment>{{1, 7}, {4, -1}}}) {
    std::multiset<int64_t> trained;
    int64_t offset = 0;
    std::string trace;
    for (const Segment& segment : plan) {
      trace += " " + std::to_string(segment.world) + "@" + std::to_string(offset);
      for (int r = 0; r < segment.world; ++r) {
        DistributedSampler s(n, segment.world, r);
        s.set_epoch(4);
        s.set_offset(offset);
        const auto mine = s.indices();
        const auto take =
            segment.batches < 0 ? mine.size() : static_cast<std::size_t>(segment.batches * batch);
        ASSERT_LE(take, mine.size());
        trained.insert(mine.begin(), mine.begin() + static_cast<std::ptrdiff_t>(take));
      }
      if (segment.batches >= 0) offset += segment.batches * batch * segment.world;
    }
    SCOPED_TRACE("world@offset:" + trace);
    // The last segment pads its share to equal shards, as a fixed world does at the epoch's end.
    const int last_world = plan.back().world;
    const auto padding = static_cast<std::size_t>(
        ((n - offset) + last_world - 1) / last_world * last_world - (n - offset));
    EXPECT_EQ(trained.size(), static_cast<std::size_t>(n) + padding);
    for (int64_t i = 0; i < n; ++i) {
      EXPECT_GE(trained.count(i), 1u) << "sample " << i << " skipped";
      EXPECT_LE(trained.count(i), 2u) << "sample " << i;
    }
    std::size_t twice = 0;
    for (int64_t i = 0; i < n; ++i) twice += trained.count(i) - 1;
    EXPECT_EQ(twice, padding) << "only the final padding may repeat a sample";
  }
}

TEST(DistributedSampler, TheSameWorldAtAnOffsetContinuesItsOwnShards) {
  // A restart at the same world size: the shards from offset b x batch x world are the tails of
  // the uninterrupted ones, so the data order does not change.
  const int64_t n = 50;
  const int world = 3;
  for (int r = 0; r < world; ++r) {
    DistributedSampler whole(n, world, r);
    DistributedSampler resumed(n, world, r);
    whole.set_epoch(2);
    resumed.set_epoch(2);
    resumed.set_offset(2 * 4 * world);
    const auto a = whole.indices();
    const auto b = resumed.indices();
    ASSERT_EQ(b.size() + 8, a.size());
    EXPECT_TRUE(std::equal(b.begin(), b.end(), a.begin() + 8)) << "rank " << r;
  }
}

TEST(DistributedSampler, AnOffsetOutsideTheEpochIsAConfigError) {
  DistributedSampler s(10, 2, 0);
  EXPECT_THROW(s.set_offset(11), ConfigError);
  EXPECT_THROW(s.set_offset(-1), ConfigError);
  s.set_offset(10);
  EXPECT_EQ(s.num_samples(), 0);
  EXPECT_TRUE(s.indices().empty());
}

}  // namespace
}  // namespace ddp::data
