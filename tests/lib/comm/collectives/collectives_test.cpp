// The collectives both backends share, against the in-memory transport: exact results for every
// op, dtype, reduction and algorithm at world sizes 1-8, and clear failures for mismatched or
// missing ranks.
#include "comm/collectives/collectives.h"
#include "comm/collectives/ring.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <random>
#include <thread>

#include "ddp/error.h"
#include "in_memory_transport.h"
#include "typed_values.h"

namespace ddp::detail::collectives {
namespace {

using testing::expected;
using testing::InMemoryNetwork;
using testing::TypedBuffer;
using testing::value;

constexpr std::chrono::milliseconds kTimeout{5000};

template <typename Fn>
std::vector<std::exception_ptr> run_ranks(InMemoryNetwork& fabric, Fn fn) {
  const int n = fabric.size();
  std::vector<std::unique_ptr<PeerTransport>> transports;
  for (int r = 0; r < n; ++r) transports.push_back(fabric.transport(r));
  return testing::run_threads(n, [&](int r) { fn(*transports[r], r); });
}

template <typename Fn>
void run_ok(int n, Fn fn, std::size_t max_message = std::size_t{1} << 40) {
  InMemoryNetwork fabric(n, kTimeout);
  fabric.set_max_message_bytes(max_message);
  for (auto& error : run_ranks(fabric, fn)) {
    if (error) std::rethrow_exception(error);
  }
}

struct NamedConfig {
  const char* name;
  AlgorithmConfig config;
};

std::vector<NamedConfig> configs() {
  AlgorithmConfig doubling;
  doubling.allreduce = AllreduceAlgorithm::kRecursiveDoubling;
  doubling.ring_threshold_bytes = std::size_t{1} << 40;  // broadcast: tree
  AlgorithmConfig ring_fine;
  ring_fine.allreduce = AllreduceAlgorithm::kRing;
  ring_fine.ring_threshold_bytes = 0;  // broadcast: chain
  ring_fine.chunk_bytes = 64;
  ring_fine.pipeline_depth = 1;
  AlgorithmConfig ring_deep = ring_fine;
  ring_deep.chunk_bytes = 40;
  ring_deep.pipeline_depth = 5;
  AlgorithmConfig ring_split = ring_deep;  // as the gloo backend cuts mid-sized blocks
  ring_split.chunk_bytes = 1024;
  ring_split.min_chunk_bytes = 24;
  AlgorithmConfig ring_steps = ring_deep;  // DDP_RING_ORDER=step
  ring_steps.ring_order = RingOrder::kStep;
  AlgorithmConfig direct;  // one round for every op (DDP_ALGORITHM=direct, a large budget)
  direct.allreduce = AllreduceAlgorithm::kDirect;
  direct.direct_bytes = std::size_t{1} << 40;
  AlgorithmConfig direct_then_ring = ring_split;  // as on gloo: a round, then the ring
  direct_then_ring.allreduce = AllreduceAlgorithm::kAuto;
  direct_then_ring.direct_bytes = 600;
  return {{"auto", AlgorithmConfig{}}, {"doubling", doubling},
          {"ring_fine", ring_fine},    {"ring_deep", ring_deep},
          {"ring_split", ring_split},  {"ring_steps", ring_steps},
          {"direct", direct},          {"direct_then_ring", direct_then_ring}};
}

const std::vector<std::size_t> kCounts{0, 1, 2, 7, 33, 257, 4099};

class Collectives : public ::testing::TestWithParam<int> {};

// Every dtype with sum; every reduction with one float and one integer type.
std::vector<std::pair<DataType, ReduceOp>> dtype_op_cases() {
  std::vector<std::pair<DataType, ReduceOp>> cases;
  for (DataType dtype : testing::all_dtypes()) cases.emplace_back(dtype, ReduceOp::kSum);
  for (DataType dtype : {DataType::kFloat32, DataType::kInt64}) {
    for (ReduceOp op : {ReduceOp::kAvg, ReduceOp::kMin, ReduceOp::kMax}) {
      cases.emplace_back(dtype, op);
    }
  }
  cases.emplace_back(DataType::kBFloat16, ReduceOp::kAvg);
  return cases;
}

TEST_P(Collectives, AllreduceIsExactForEveryDtypeOpAndAlgorithm) {
  const int n = GetParam();
  for (const auto& [name, config] : configs()) {
    for (auto [dtype, op] : dtype_op_cases()) {
      {
        for (std::size_t count : kCounts) {
          SCOPED_TRACE(std::string(name) + " " + to_string(dtype) + " " + to_string(op) +
                       " count " + std::to_string(count));
          std::vector<TypedBuffer> buffers(n, TypedBuffer(count, dtype));
          for (int r = 0; r < n; ++r) {
            for (std::size_t i = 0; i < count; ++i) buffers[r].set(i, value(r, i));
          }
          run_ok(n, [&](PeerTransport& t, int r) { allreduce(t, buffers[r].view(), op, config); });
          for (int r = 0; r < n; ++r) {
            for (std::size_t i = 0; i < count; ++i) {
              ASSERT_EQ(buffers[r].get(i), expected(op, n, i, dtype)) << "rank " << r << " i " << i;
            }
          }
        }
      }
    }
  }
}

TEST_P(Collectives, AllreduceGivesBitwiseIdenticalFloatsOnEveryRank) {
  const int n = GetParam();
  for (const auto& [name, config] : configs()) {
    SCOPED_TRACE(name);
    const std::size_t count = 3001;
    std::vector<std::vector<float>> data(n, std::vector<float>(count));
    std::mt19937 rng(42);
    std::uniform_real_distribution<float> dist(-1, 1);
    for (auto& d : data) {
      for (auto& x : d) x = dist(rng);
    }
    run_ok(n,
           [&](PeerTransport& t, int r) { allreduce(t, Buffer(data[r]), ReduceOp::kSum, config); });
    for (int r = 1; r < n; ++r) {
      ASSERT_EQ(0, std::memcmp(data[0].data(), data[r].data(), count * sizeof(float)))
          << "rank " << r << " differs from rank 0";
    }
  }
}

TEST_P(Collectives, BroadcastDeliversTheRootsBufferFromEveryRoot) {
  const int n = GetParam();
  for (const auto& [name, config] : configs()) {
    for (DataType dtype : {DataType::kFloat32, DataType::kInt64, DataType::kFloat16}) {
      for (std::size_t count : kCounts) {
        for (int root = 0; root < n; ++root) {
          SCOPED_TRACE(std::string(name) + " " + to_string(dtype) + " count " +
                       std::to_string(count) + " root " + std::to_string(root));
          std::vector<TypedBuffer> buffers(n, TypedBuffer(count, dtype));
          for (int r = 0; r < n; ++r) {
            for (std::size_t i = 0; i < count; ++i) buffers[r].set(i, value(r, i));
          }
          run_ok(n,
                 [&](PeerTransport& t, int r) { broadcast(t, buffers[r].view(), root, config); });
          for (int r = 0; r < n; ++r) {
            for (std::size_t i = 0; i < count; ++i) ASSERT_EQ(buffers[r].get(i), value(root, i));
          }
        }
      }
    }
  }
}

TEST_P(Collectives, AllgatherPlacesEachRanksInputAtItsOffset) {
  const int n = GetParam();
  for (const auto& [name, config] : configs()) {
    for (DataType dtype : {DataType::kFloat64, DataType::kInt32, DataType::kBFloat16}) {
      for (std::size_t count : kCounts) {
        SCOPED_TRACE(std::string(name) + " " + to_string(dtype) + " count " +
                     std::to_string(count));
        std::vector<TypedBuffer> inputs(n, TypedBuffer(count, dtype));
        std::vector<TypedBuffer> outputs(n, TypedBuffer(count * n, dtype));
        for (int r = 0; r < n; ++r) {
          for (std::size_t i = 0; i < count; ++i) inputs[r].set(i, value(r, i));
        }
        run_ok(n, [&](PeerTransport& t, int r) {
          allgather(t, inputs[r].view(), outputs[r].view(), config);
        });
        for (int r = 0; r < n; ++r) {
          for (int from = 0; from < n; ++from) {
            for (std::size_t i = 0; i < count; ++i) {
              ASSERT_EQ(outputs[r].get(from * count + i), value(from, i));
            }
          }
        }
      }
    }
  }
}

TEST_P(Collectives, ReduceScatterGivesEachRankItsReducedBlockAndKeepsTheInput) {
  const int n = GetParam();
  for (const auto& [name, config] : configs()) {
    for (auto [dtype, op] : dtype_op_cases()) {
      {
        for (std::size_t count : kCounts) {
          SCOPED_TRACE(std::string(name) + " " + to_string(dtype) + " " + to_string(op) +
                       " count " + std::to_string(count));
          std::vector<TypedBuffer> inputs(n, TypedBuffer(count * n, dtype));
          std::vector<TypedBuffer> outputs(n, TypedBuffer(count, dtype));
          for (int r = 0; r < n; ++r) {
            for (std::size_t i = 0; i < count * n; ++i) inputs[r].set(i, value(r, i));
          }
          auto before = inputs;
          run_ok(n, [&](PeerTransport& t, int r) {
            reduce_scatter(t, inputs[r].view(), outputs[r].view(), op, config);
          });
          for (int r = 0; r < n; ++r) {
            ASSERT_EQ(inputs[r].bytes, before[r].bytes) << "input of rank " << r << " changed";
            for (std::size_t i = 0; i < count; ++i) {
              ASSERT_EQ(outputs[r].get(i), expected(op, n, r * count + i, dtype));
            }
          }
        }
      }
    }
  }
}

TEST_P(Collectives, BarrierReleasesNoRankBeforeAllArrived) {
  const int n = GetParam();
  for (const auto& [name, config] : configs()) {
    SCOPED_TRACE(name);  // dissemination, or one round where the config takes rounds
    for (int round = 0; round < 20; ++round) {
      std::atomic<int> arrived{0};
      std::atomic<bool> early{false};
      run_ok(n, [&](PeerTransport& t, int r) {
        if (r == round % n) std::this_thread::sleep_for(std::chrono::milliseconds(2));
        arrived.fetch_add(1);
        barrier(t, config);
        if (arrived.load() != n) early = true;
      });
      ASSERT_FALSE(early.load()) << "a rank left the barrier before every rank entered it";
    }
  }
}

TEST_P(Collectives, BackToBackOpsOfDifferentKindsStayApart) {
  const int n = GetParam();
  AlgorithmConfig plain;
  plain.chunk_bytes = 128;
  plain.ring_threshold_bytes = 512;
  // Rounds for the small ops, the ring and the chain for the large ones, mixed in one stream.
  AlgorithmConfig mixed = plain;
  mixed.direct_bytes = 1024;
  for (const AlgorithmConfig& config : {plain, mixed}) {
    run_ok(n, [&](PeerTransport& t, int r) {
      for (int iter = 0; iter < 30; ++iter) {
        const std::size_t count = 1 + (iter * 37) % 300;
        std::vector<std::int64_t> data(count, r + 1);
        allreduce(t, Buffer(data), ReduceOp::kSum, config);
        for (auto v : data) ASSERT_EQ(v, n * (n + 1) / 2);
        barrier(t, config);
        std::vector<std::int64_t> gathered(count * n);
        allgather(t, Buffer(data.data(), count), Buffer(gathered), config);
        for (auto v : gathered) ASSERT_EQ(v, n * (n + 1) / 2);
        std::vector<std::int64_t> root_data(count, r == iter % n ? iter : -1);
        broadcast(t, Buffer(root_data), iter % n, config);
        for (auto v : root_data) ASSERT_EQ(v, iter);
      }
    });
  }
}

TEST_P(Collectives, MessagesRespectTheTransportsSizeLimit) {
  const int n = GetParam();
  AlgorithmConfig config;
  config.ring_threshold_bytes = 0;
  config.allreduce = AllreduceAlgorithm::kRing;
  const std::size_t count = 1000;
  std::vector<std::vector<std::int32_t>> data(n);
  for (int r = 0; r < n; ++r) data[r].assign(count, r);
  run_ok(
      n,
      [&](PeerTransport& t, int r) {
        allreduce(t, Buffer(data[r]), ReduceOp::kSum, config);
        broadcast(t, Buffer(data[r]), n - 1, config);
      },
      /*max_message=*/52);
  for (int r = 0; r < n; ++r) {
    for (auto v : data[r]) ASSERT_EQ(v, n * (n - 1) / 2);
  }
}

TEST_P(Collectives, AllreduceSendsAFewEagerMessagesInsteadOfOneLargeOne) {
  const int n = GetParam();
  if (n == 1) GTEST_SKIP() << "one rank sends nothing";
  AlgorithmConfig doubling;
  doubling.allreduce = AllreduceAlgorithm::kRecursiveDoubling;
  constexpr std::size_t kEager = 64;
  // 16 floats fit one eager message; 17 and 512 take 2 and 32; 513 is past the split limit.
  for (std::size_t count : {16, 17, 100, 512, 513}) {
    SCOPED_TRACE("count " + std::to_string(count));
    InMemoryNetwork fabric(n, kTimeout);
    fabric.set_eager_message_bytes(kEager);
    std::vector<std::vector<float>> data(n);
    for (int r = 0; r < n; ++r) {
      for (std::size_t i = 0; i < count; ++i) data[r].push_back(static_cast<float>(value(r, i)));
    }
    // The in-memory transport rejects a larger send from the caller's (unexposed) buffer.
    for (auto& error : run_ranks(fabric, [&](PeerTransport&t, int r) {
           allreduce(t, Buffer(data[r]), ReduceOp::kSum, doubling);
         })) {
      if (error) std::rethrow_exception(error);
    }
    for (int r = 0; r < n; ++r) {
      for (std::size_t i = 0; i < count; ++i) {
        ASSERT_EQ(data[r][i], expected(ReduceOp::kSum, n, i, DataType::kFloat32));
      }
    }
    const std::size_t bytes = count * sizeof(float);
    const bool split = bytes <= 32 * kEager;
    EXPECT_EQ(fabric.largest_message_bytes() <= kEager, split)
        << "largest message " << fabric.largest_message_bytes() << " bytes";
  }
}

// A round is taken while the bytes a rank sends (payload x peers) stay below direct_bytes and the
// payload fits the transport's round; DDP_ALGORITHM=direct takes it wherever the payload fits.
TEST(DirectCollectives, ARoundIsTakenBelowTheBytesSentPerRankAndWhereThePayloadFits) {
  InMemoryNetwork network(5, kTimeout);
  network.set_max_message_bytes(4096);  // the default round carries one message per peer
  auto transport = network.transport(0);
  AlgorithmConfig config;
  config.direct_bytes = 8192;  // 4 peers: payloads below 2 KiB
  config.ring_threshold_bytes = 0;
  EXPECT_EQ(choose_allreduce(*transport, 2047, 2047, config), AllreduceAlgorithm::kDirect);
  EXPECT_EQ(choose_allreduce(*transport, 2048, 2048, config), AllreduceAlgorithm::kRing);
  config.allreduce = AllreduceAlgorithm::kDirect;
  EXPECT_EQ(choose_allreduce(*transport, 4096, 4096, config), AllreduceAlgorithm::kDirect);
  EXPECT_EQ(choose_allreduce(*transport, 4097, 4097, config), AllreduceAlgorithm::kRing)
      << "a payload the round cannot carry takes auto's choice among the others";
  config.allreduce = AllreduceAlgorithm::kAuto;
  config.direct_bytes = 0;
  EXPECT_EQ(choose_allreduce(*transport, 8, 8, config), AllreduceAlgorithm::kRing);
  // Where messages are unbounded, the default round stops at 64 MiB of scratch for all ranks.
  InMemoryNetwork unbounded(4, kTimeout);
  EXPECT_EQ(unbounded.transport(0)->round_payload_bytes(), (std::size_t{64} << 20) / 4);
}

// A transport may have two ranks exchange the whole buffer (recursive doubling's one step)
// where others take the ring, up to the largest message.
TEST(ChooseAllreduce, TwoRanksTakeDoublingAtEverySizeWhereTheTransportSaysSo) {
  InMemoryNetwork pair(2, kTimeout);
  pair.set_max_message_bytes(1 << 20);
  auto transport = pair.transport(0);
  AlgorithmConfig config;
  config.ring_threshold_bytes = 0;
  EXPECT_EQ(choose_allreduce(*transport, 4096, 1024, config), AllreduceAlgorithm::kRing);
  config.ring_for_two_ranks = false;
  EXPECT_EQ(choose_allreduce(*transport, 4096, 1024, config),
            AllreduceAlgorithm::kRecursiveDoubling);
  EXPECT_EQ(choose_allreduce(*transport, 1 << 20, 1 << 18, config),
            AllreduceAlgorithm::kRecursiveDoubling);
  EXPECT_EQ(choose_allreduce(*transport, (1 << 20) + 4, (1 << 18) + 1, config),
            AllreduceAlgorithm::kRing)
      << "past the largest message the ring";
  InMemoryNetwork three(3, kTimeout);
  EXPECT_EQ(choose_allreduce(*three.transport(0), 4096, 1024, config), AllreduceAlgorithm::kRing)
      << "three ranks: doubling would send more bytes than the ring";
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, Collectives, ::testing::Values(1, 2, 3, 4, 5, 7, 8),
                         [](const auto& info) { return "ranks" + std::to_string(info.param); });

TEST(RingLayout, MidSizedBlocksAreCutIntoSeveralChunksWhenAMinimumIsSet) {
  AlgorithmConfig config;
  config.chunk_bytes = 4u << 20;
  constexpr std::size_t kMiBFloats = (1u << 20) / 4;
  // 2 ranks, 4 MiB: blocks of 2 MiB go as one chunk each, so nothing overlaps.
  EXPECT_EQ(ring_layout(4 * kMiBFloats, DataType::kFloat32, 2, config, 1ull << 40).chunks_per_block,
            1u);
  config.min_chunk_bytes = 1u << 20;
  const auto mid = ring_layout(4 * kMiBFloats, DataType::kFloat32, 2, config, 1ull << 40);
  EXPECT_EQ(mid.chunks_per_block, 2u);  // four would be below the 1 MiB minimum
  EXPECT_EQ(mid.max_chunk_bytes, 1u << 20);
  const auto eight = ring_layout(16 * kMiBFloats, DataType::kFloat32, 2, config, 1ull << 40);
  EXPECT_EQ(eight.chunks_per_block, 4u);  // 8 MiB blocks: four 2 MiB chunks
  const auto large = ring_layout(64 * kMiBFloats, DataType::kFloat32, 2, config, 1ull << 40);
  EXPECT_EQ(large.max_chunk_bytes, 4u << 20);  // large blocks keep the full chunk size
  EXPECT_EQ(large.chunks_per_block, 8u);
}

TEST(RingOrder, EveryChunkTakesItsStepsInTurnAndSoonAfterEachOther) {
  for (int steps : {1, 2, 3, 7, 14}) {
    for (std::size_t chunks : {1u, 2u, 5u, 64u}) {
      SCOPED_TRACE("steps " + std::to_string(steps) + ", chunks " + std::to_string(chunks));
      const auto order = wavefront_order(steps, chunks);
      ASSERT_EQ(order.size(), static_cast<std::size_t>(steps) * chunks);
      std::vector<std::vector<long>> position(steps, std::vector<long>(chunks, -1));
      for (std::size_t i = 0; i < order.size(); ++i) {
        const auto [step, chunk] = order[i];
        ASSERT_TRUE(step >= 0 && step < steps && chunk < chunks);
        ASSERT_EQ(position[step][chunk], -1) << "taken twice: step " << step << ", chunk " << chunk;
        position[step][chunk] = static_cast<long>(i);
      }
      for (int step = 1; step < steps; ++step) {
        for (std::size_t chunk = 0; chunk < chunks; ++chunk) {
          const long gap = position[step][chunk] - position[step - 1][chunk];
          // A chunk's next step never comes before its previous one (the ranks would deadlock),
          // and comes within a diagonal of it (a diagonal holds at most min(steps, chunks)
          // segments), not a whole step of `chunks` segments later as in step order.
          EXPECT_GT(gap, 0) << "step " << step << ", chunk " << chunk;
          EXPECT_LE(gap, static_cast<long>(std::min<std::size_t>(steps, chunks)) + 1)
              << "step " << step << ", chunk " << chunk;
        }
      }
    }
  }
}

TEST(RingOrder, StepOrderTakesEveryChunkOfAStepBeforeTheNextStep) {
  const auto order = step_order(3, 4);
  ASSERT_EQ(order.size(), 12u);
  for (std::size_t i = 0; i < order.size(); ++i) {
    EXPECT_EQ(order[i].step, static_cast<int>(i / 4));
    EXPECT_EQ(order[i].chunk, i % 4);
  }
}

TEST(CollectivesFailures, MismatchedSizesFailEveryRankWithCommError) {
  for (const auto& [name, config] : configs()) {
    for (int n : {2, 3, 4}) {
      SCOPED_TRACE(std::string(name) + " ranks " + std::to_string(n));
      InMemoryNetwork fabric(n, std::chrono::milliseconds(200));
      std::vector<std::vector<float>> data(n);
      for (int r = 0; r < n; ++r) data[r].assign(r == 1 ? 1001 : 1000, 1.0f);
      auto errors = run_ranks(fabric, [&](PeerTransport& t, int r) {
        allreduce(t, Buffer(data[r]), ReduceOp::kSum, config);
      });
      int mismatch_reports = 0;
      for (int r = 0; r < n; ++r) {
        ASSERT_TRUE(errors[r]) << "rank " << r << " did not fail";
        try {
          std::rethrow_exception(errors[r]);
        } catch (const CommError& e) {
          EXPECT_EQ(e.op(), "allreduce");
          if (std::string(e.what()).find(" issued allreduce(") != std::string::npos)
            ++mismatch_reports;
        }
      }
      EXPECT_GE(mismatch_reports, 1);
    }
  }
}

TEST(CollectivesFailures, MissingRankTimesOutNamingAPeer) {
  const int n = 3;
  InMemoryNetwork fabric(n, std::chrono::milliseconds(300));
  std::vector<std::vector<float>> data(n, std::vector<float>(100, 1.0f));
  const auto start = std::chrono::steady_clock::now();
  auto errors = run_ranks(fabric, [&](PeerTransport& t, int r) {
    if (r == 2) return;  // never joins
    allreduce(t, Buffer(data[r]), ReduceOp::kSum, AlgorithmConfig{});
  });
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(3));
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(errors[r]);
    try {
      std::rethrow_exception(errors[r]);
    } catch (const TimeoutError& e) {
      EXPECT_GE(e.peer(), 0);
    }
  }
}

}  // namespace
}  // namespace ddp::detail::collectives
