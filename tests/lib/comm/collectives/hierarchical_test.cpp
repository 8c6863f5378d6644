// The hierarchical collectives (lib/src/comm/collectives/hierarchical.h) against in-memory
// transports: one network per node and one per local index, every rank a thread. Exact results
// for every dtype and reduction at 2×2, 3×2, 2×3 and 2×4, on both sides of the switch from the
// whole-buffer steps to the slices; broadcasts from every root; the barrier; and the choice
// between flat and hierarchical for every shape of topology.
#include "comm/collectives/hierarchical.h"

#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <thread>

#include "ddp/error.h"
#include "in_memory_transport.h"
#include "scoped_env.h"
#include "typed_values.h"

namespace ddp::detail::collectives {
namespace {

using testing::expected;
using testing::InMemoryNetwork;
using testing::TypedBuffer;
using testing::value;

constexpr std::chrono::milliseconds kTimeout{5000};

struct Shape {
  int nodes;
  int local;
};

// Runs fn(hierarchy, node, local_rank) on nodes × local threads.
template <typename Fn>
void run_hierarchy(Shape shape, const AlgorithmConfig& local_config,
                   const AlgorithmConfig& cross_config, Fn fn,
                   std::chrono::milliseconds timeout = kTimeout) {
  std::vector<std::unique_ptr<InMemoryNetwork>> node_networks;
  std::vector<std::unique_ptr<InMemoryNetwork>> cross_networks;
  for (int n = 0; n < shape.nodes; ++n) {
    node_networks.push_back(std::make_unique<InMemoryNetwork>(shape.local, timeout));
  }
  for (int l = 0; l < shape.local; ++l) {
    cross_networks.push_back(std::make_unique<InMemoryNetwork>(shape.nodes, timeout));
  }
  const int world = shape.nodes * shape.local;
  std::vector<std::unique_ptr<PeerTransport>> local(world);
  std::vector<std::unique_ptr<PeerTransport>> cross(world);
  for (int n = 0; n < shape.nodes; ++n) {
    for (int l = 0; l < shape.local; ++l) {
      local[n * shape.local + l] = node_networks[n]->transport(l);
      cross[n * shape.local + l] = cross_networks[l]->transport(n);
    }
  }
  const auto errors = testing::run_threads(world, [&](int r) {
    fn(Hierarchy{*local[r], *cross[r], local_config, cross_config}, r / shape.local,
       r % shape.local);
  });
  for (const auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

// One round per step wherever a payload allows (gloo's rounds).
AlgorithmConfig round_config() {
  AlgorithmConfig config;
  config.direct_bytes = std::size_t{1} << 20;
  return config;
}

AlgorithmConfig ring_config(std::size_t chunk_bytes) {
  AlgorithmConfig config;
  config.allreduce = AllreduceAlgorithm::kRing;
  config.ring_threshold_bytes = 0;
  config.chunk_bytes = chunk_bytes;
  config.pipeline_depth = 2;
  return config;
}

class Hierarchical : public ::testing::TestWithParam<Shape> {};

TEST_P(Hierarchical, AllreduceIsExactForEveryDtypeAndOp) {
  const Shape shape = GetParam();
  const int world = shape.nodes * shape.local;
  AlgorithmConfig doubling;
  doubling.allreduce = AllreduceAlgorithm::kRecursiveDoubling;
  // As on gloo: each level's steps in one round while small, the ring past that, and the whole
  // buffer across nodes up to a larger size than the default's.
  AlgorithmConfig direct = ring_config(1024);
  direct.allreduce = AllreduceAlgorithm::kAuto;
  direct.direct_bytes = 12 * 1024;
  direct.slice_from_bytes = 4 * 1024;
  // Pieces of 1 KiB: the larger counts run pipelined, up to 40 pieces, the others in one.
  AlgorithmConfig pieces = ring_config(256);
  pieces.piece_bytes = 1024;
  AlgorithmConfig direct_pieces = direct;
  direct_pieces.piece_bytes = 1024;
  const std::pair<const char*, AlgorithmConfig> configs[] = {
      {"auto", AlgorithmConfig{}}, {"ring", ring_config(96)}, {"doubling", doubling},
      {"direct", direct},          {"ring pieces", pieces},   {"direct pieces", direct_pieces}};
  // 0 and 1 elements, fewer elements than local ranks, and both sides of the slice switch in
  // every element size.
  const std::size_t counts[] = {0, 1, 3, 257, 1025, 2053, 5003};
  for (const auto& [name, config] : configs) {
    for (DataType dtype : testing::all_dtypes()) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMin, ReduceOp::kMax}) {
        for (std::size_t count : counts) {
          SCOPED_TRACE(std::string(name) + " " + to_string(dtype) + " " + to_string(op) +
                       " count " + std::to_string(count));
          std::vector<TypedBuffer> buffers(world, TypedBuffer(count, dtype));
          for (int r = 0; r < world; ++r) {
            for (std::size_t i = 0; i < count; ++i) buffers[r].set(i, value(r, i));
          }
          run_hierarchy(shape, config, config, [&](const Hierarchy& h, int node, int local) {
            allreduce_hierarchical(h, buffers[node * shape.local + local].view(), op);
          });
          for (int r = 0; r < world; ++r) {
            for (std::size_t i = 0; i < count; ++i) {
              ASSERT_EQ(buffers[r].get(i), expected(op, world, i, dtype))
                  << "rank " << r << " element " << i;
            }
          }
        }
      }
    }
  }
}

TEST_P(Hierarchical, BroadcastDeliversTheRootsBufferFromEveryRoot) {
  const Shape shape = GetParam();
  const int world = shape.nodes * shape.local;
  for (std::size_t count : {std::size_t{0}, std::size_t{5}, std::size_t{3001}}) {
    for (int root = 0; root < world; ++root) {
      SCOPED_TRACE("count " + std::to_string(count) + " root " + std::to_string(root));
      for (const AlgorithmConfig& cross : {AlgorithmConfig{}, round_config()}) {
        std::vector<TypedBuffer> buffers(world, TypedBuffer(count, DataType::kFloat32));
        for (int r = 0; r < world; ++r) {
          for (std::size_t i = 0; i < count; ++i) buffers[r].set(i, value(r, i));
        }
        run_hierarchy(shape, ring_config(256), cross, [&](const Hierarchy& h, int node, int local) {
          broadcast_hierarchical(h, buffers[node * shape.local + local].view(), root / shape.local,
                                 root % shape.local);
        });
        for (int r = 0; r < world; ++r) {
          for (std::size_t i = 0; i < count; ++i) ASSERT_EQ(buffers[r].get(i), value(root, i));
        }
      }
    }
  }
}

// Job ranks laid out node by node (rank = node·L + local) and round robin (rank = local·N + node,
// as a launcher that deals ranks across pods would): the gathered blocks must land in job order.
std::vector<Topology> placements(Shape shape) {
  const int world = shape.nodes * shape.local;
  std::vector<std::string> by_node(world);
  std::vector<std::string> round_robin(world);
  for (int r = 0; r < world; ++r) {
    by_node[r] = "n" + std::to_string(r / shape.local);
    round_robin[r] = "n" + std::to_string(r % shape.nodes);
  }
  return {Topology(by_node, 0), Topology(round_robin, 0)};
}

TEST_P(Hierarchical, AllgatherAndReduceScatterAreExactInJobRankOrder) {
  const Shape shape = GetParam();
  const int world = shape.nodes * shape.local;
  AlgorithmConfig direct = round_config();
  direct.slice_from_bytes = 0;
  const std::pair<const char*, AlgorithmConfig> configs[] = {{"ring", ring_config(64)},
                                                             {"direct", direct}};
  for (const Topology& topology : placements(shape)) {
    // The job rank of thread (node, local).
    auto job_rank = [&](int node, int local) { return topology.members(node)[local]; };
    for (const auto& [name, config] : configs) {
      for (DataType dtype : testing::all_dtypes()) {
        for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{333}}) {
          SCOPED_TRACE(std::string(name) + " " + to_string(dtype) + " count " +
                       std::to_string(count) + " rank 1 on node " +
                       std::to_string(topology.node_of(1)));
          std::vector<TypedBuffer> inputs(world, TypedBuffer(count, dtype));
          std::vector<TypedBuffer> outputs(world, TypedBuffer(count * world, dtype));
          for (int r = 0; r < world; ++r) {
            for (std::size_t i = 0; i < count; ++i) inputs[r].set(i, value(r, i));
          }
          run_hierarchy(shape, config, config, [&](const Hierarchy& h, int node, int local) {
            const int r = job_rank(node, local);
            allgather_hierarchical(h, topology, inputs[r].view(), outputs[r].view());
          });
          for (int r = 0; r < world; ++r) {
            for (int from = 0; from < world; ++from) {
              for (std::size_t i = 0; i < count; ++i) {
                ASSERT_EQ(outputs[r].get(from * count + i), value(from, i))
                    << "rank " << r << " block " << from << " element " << i;
              }
            }
          }
          for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMin, ReduceOp::kMax}) {
            SCOPED_TRACE(to_string(op));
            std::vector<TypedBuffer> whole(world, TypedBuffer(count * world, dtype));
            std::vector<TypedBuffer> mine(world, TypedBuffer(count, dtype));
            for (int r = 0; r < world; ++r) {
              for (std::size_t i = 0; i < count * world; ++i) whole[r].set(i, value(r, i));
            }
            const std::vector<TypedBuffer> untouched = whole;
            run_hierarchy(shape, config, config, [&](const Hierarchy& h, int node, int local) {
              const int r = job_rank(node, local);
              reduce_scatter_hierarchical(h, topology, whole[r].view(), mine[r].view(), op);
            });
            for (int r = 0; r < world; ++r) {
              ASSERT_EQ(whole[r].bytes, untouched[r].bytes) << "rank " << r << "'s input changed";
              for (std::size_t i = 0; i < count; ++i) {
                ASSERT_EQ(mine[r].get(i), expected(op, world, r * count + i, dtype))
                    << "rank " << r << " element " << i;
              }
            }
          }
        }
      }
    }
  }
}

TEST_P(Hierarchical, BarrierHoldsEveryRankUntilTheLastEnters) {
  const Shape shape = GetParam();
  const int world = shape.nodes * shape.local;
  for (int late = 0; late < world; ++late) {
    std::atomic<int> entered{0};
    std::atomic<int> left_early{0};
    // Dissemination inside the node, one round across.
    run_hierarchy(shape, AlgorithmConfig{}, round_config(),
                  [&](const Hierarchy& h, int node, int local) {
                    if (node * shape.local + local == late) {
                      std::this_thread::sleep_for(std::chrono::milliseconds(20));
                    }
                    entered++;
                    barrier_hierarchical(h);
                    if (entered.load() != world) left_early++;
                  });
    EXPECT_EQ(left_early.load(), 0) << "late rank " << late;
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, Hierarchical,
                         ::testing::Values(Shape{2, 2}, Shape{3, 2}, Shape{2, 3}, Shape{2, 4},
                                           Shape{4, 2}),
                         [](const ::testing::TestParamInfo<Shape>& info) {
                           return std::to_string(info.param.nodes) + "x" +
                                  std::to_string(info.param.local);
                         });

// A rank that never reaches the cross step: its counterparts time out, and so does its node,
// which waits for it in the allgather; nothing hangs.
TEST(HierarchicalFailure, AMissingRankTimesOutEveryRankThatWaitsForIt) {
  std::atomic<int> timed_out{0};
  run_hierarchy(
      Shape{2, 2}, AlgorithmConfig{}, AlgorithmConfig{},
      [&](const Hierarchy& h, int node, int local) {
        if (node == 1 && local == 1) return;  // leaves without a word
        std::vector<float> data(4096, 1.0f);
        try {
          allreduce_hierarchical(h, Buffer(data), ReduceOp::kSum);
        } catch (const TimeoutError&) {
          timed_out++;
        }
      },
      std::chrono::milliseconds(500));
  EXPECT_EQ(timed_out.load(), 3);
}

// The same with the pipeline: the missing rank's node and counterparts fail, whichever thread
// (the node's steps or the steps across nodes) waits for it, and no thread is left behind.
TEST(HierarchicalFailure, AMissingRankFailsThePipelinedAllreduceToo) {
  AlgorithmConfig config;
  config.piece_bytes = 4096;
  ASSERT_EQ(pipeline_pieces(config, 64 * 1024, 2), 16u);
  for (int missing = 0; missing < 4; ++missing) {
    std::atomic<int> failed{0};
    run_hierarchy(
        Shape{2, 2}, config, config,
        [&](const Hierarchy& h, int node, int local) {
          if (node * 2 + local == missing) return;
          std::vector<float> data(16 * 1024, 1.0f);
          try {
            allreduce_hierarchical(h, Buffer(data), ReduceOp::kSum);
          } catch (const TimeoutError&) {
            failed++;
          }
        },
        std::chrono::milliseconds(500));
    EXPECT_EQ(failed.load(), 3) << "missing rank " << missing;
  }
}

TEST(PipelinePieces, PieceBytesPerNodeSentToAndAtMostSixtyFour) {
  AlgorithmConfig config;  // 1 MiB per node sent to
  EXPECT_EQ(pipeline_pieces(config, (1u << 20) * 2 - 1, 2), 1u);
  EXPECT_EQ(pipeline_pieces(config, 4u << 20, 2), 4u);
  EXPECT_EQ(pipeline_pieces(config, 64u << 20, 2), 64u);
  EXPECT_EQ(pipeline_pieces(config, 1u << 30, 2), 64u);
  EXPECT_EQ(pipeline_pieces(config, 12u << 20, 4), 4u) << "3 MiB pieces across 4 nodes";
  EXPECT_EQ(pipeline_pieces(config, 64u << 20, 1), 1u);
  config.piece_bytes = 0;
  EXPECT_EQ(pipeline_pieces(config, 64u << 20, 2), 1u);
}

Topology topology_of(const std::vector<std::string>& keys) { return Topology(keys, 0); }

TEST(DecideHierarchy, HierarchicalOnlyForEvenNodesOfSeveralRanks) {
  const auto two_by_two = topology_of({"a", "a", "b", "b"});
  EXPECT_TRUE(decide_hierarchy(two_by_two, CollectivesMode::kAuto).hierarchical);
  EXPECT_EQ(decide_hierarchy(two_by_two, CollectivesMode::kAuto).reason, "2 nodes × 2 ranks");
  EXPECT_FALSE(decide_hierarchy(two_by_two, CollectivesMode::kFlat).hierarchical);
  // Ranks need not be contiguous per node.
  const auto interleaved = topology_of({"a", "b", "a", "b"});
  EXPECT_TRUE(decide_hierarchy(interleaved, CollectivesMode::kAuto).hierarchical);
  EXPECT_EQ(interleaved.members(1), (std::vector<int>{1, 3}));
  EXPECT_EQ(interleaved.local_rank_of(3), 1);

  const auto one_node = topology_of({"a", "a", "a", "a"});
  EXPECT_FALSE(decide_hierarchy(one_node, CollectivesMode::kAuto).hierarchical);
  EXPECT_FALSE(decide_hierarchy(one_node, CollectivesMode::kAuto).fell_back);
  EXPECT_TRUE(decide_hierarchy(one_node, CollectivesMode::kHierarchical).fell_back);
  EXPECT_EQ(one_node.describe(), "1 node × 4 ranks");

  const auto one_per_node = topology_of({"a", "b", "c", "d"});
  EXPECT_FALSE(decide_hierarchy(one_per_node, CollectivesMode::kAuto).hierarchical);
  EXPECT_EQ(one_per_node.describe(), "4 nodes × 1 rank");

  const auto uneven = topology_of({"a", "a", "b"});
  const auto decision = decide_hierarchy(uneven, CollectivesMode::kAuto);
  EXPECT_FALSE(decision.hierarchical);
  EXPECT_TRUE(decision.fell_back);
  EXPECT_EQ(decision.reason, "uneven nodes (ranks per node: 2, 1)");
  EXPECT_EQ(uneven.describe(), "2 nodes × 1-2 ranks (uneven)");
}

TEST(DecideHierarchy, TheModeComesFromDdpCollectives) {
  {
    ddp::testing::ScopedEnv env("DDP_COLLECTIVES", "flat");
    EXPECT_EQ(collectives_mode({}), CollectivesMode::kFlat);
  }
  {
    ddp::testing::ScopedEnv env("DDP_COLLECTIVES", "hierarchical");
    EXPECT_EQ(collectives_mode({}), CollectivesMode::kHierarchical);
  }
  {
    ddp::testing::ScopedEnv env("DDP_COLLECTIVES", "tree");
    EXPECT_THROW(collectives_mode({}), ConfigError);
  }
  ddp::testing::ScopedEnv env("DDP_COLLECTIVES", "flat");
  CommOptions options;
  options.collectives = CollectivesMode::kHierarchical;
  EXPECT_EQ(collectives_mode(options), CollectivesMode::kHierarchical) << "code wins";
}

TEST(DecideHierarchy, TestHostIdReplacesTheNodeKey) {
  ddp::testing::ScopedEnv env("DDP_TEST_HOST_ID", "pod-7");
  EXPECT_EQ(ddp::detail::node_key(), "test:pod-7");
}

}  // namespace
}  // namespace ddp::detail::collectives
