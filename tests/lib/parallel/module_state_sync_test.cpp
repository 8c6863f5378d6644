// Unit test of lib/src/parallel/module_state_sync.cpp: verify_same_tensors fails on every rank
// when any rank's list of tensors differs from rank 0's (the differing rank naming the first
// difference, the others naming the differing ranks), and broadcast_from_rank0 gives every rank
// rank 0's values, one broadcast per wire dtype. Ranks are threads of this process joined by an
// in-memory communicator (thread_group.h).
#include "parallel/module_state_sync.h"

#include <ATen/ATen.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "ddp/error.h"
#include "thread_group.h"

namespace ddp::detail {
namespace {

using testing::error_of;
using testing::failures;
using testing::ThreadGroup;

const std::string kFix = "; every rank must build the same model (architecture and input shape)";

// A small model's state: a float weight [2, 3], a float bias [3] and an int64 buffer [4].
std::vector<NamedTensor> model_state() {
  return {{"parameter", "weight", at::zeros({2, 3})},
          {"parameter", "bias", at::zeros({3})},
          {"buffer", "count", at::zeros({4}, at::kLong)}};
}

// Runs verify_same_tensors on every rank of `size`, with the list `state_of(rank)` gives.
template <typename StateOf>
std::vector<std::exception_ptr> verify(ThreadGroup& group, StateOf state_of) {
  return group.run([&](Communicator& comm) { verify_same_tensors(state_of(comm.rank()), comm); });
}

TEST(VerifySameTensors, IdenticalListsPassOnEveryRank) {
  ThreadGroup group(3);
  const auto errors = verify(group, [](int) { return model_state(); });
  EXPECT_EQ(failures(errors), "");
  // Collective: every rank took part in the same collectives, all from or to rank 0.
  for (int r = 0; r < 3; ++r) {
    const auto calls = group.calls(r);
    ASSERT_FALSE(calls.empty());
    EXPECT_EQ(calls.back().op, "allgather") << "the verdicts are gathered last";
    for (const auto& call : calls) {
      EXPECT_EQ(call.dtype, DataType::kInt64);
      if (call.op == "broadcast") {
        EXPECT_EQ(call.root, 0);
      }
    }
    EXPECT_EQ(calls.size(), group.calls(0).size());
  }
}

TEST(VerifySameTensors, ValuesAreNotCompared) {
  ThreadGroup group(2);
  const auto errors = verify(group, [](int rank) {
    auto state = model_state();
    state[0].tensor.fill_(rank + 1.0);  // values differ: they are broadcast later, not compared
    return state;
  });
  EXPECT_EQ(failures(errors), "");
}

TEST(VerifySameTensors, AShapeDifferenceIsNamedOnTheDifferingRank) {
  ThreadGroup group(3);
  const auto errors = verify(group, [](int rank) {
    auto state = model_state();
    if (rank == 2) state[2].tensor = at::zeros({5}, at::kLong);
    return state;
  });
  EXPECT_EQ(error_of(errors, 2),
            "buffer 'count' is Long [5] on rank 2 but rank 0 has a buffer Long [4] there" + kFix);
  const std::string others =
      "rank(s) 2 built a different model than rank 0 (see their error for the first "
      "difference)" +
      kFix;
  EXPECT_EQ(error_of(errors, 0), others);
  EXPECT_EQ(error_of(errors, 1), others);
}

TEST(VerifySameTensors, ADtypeDifferenceIsNamed) {
  ThreadGroup group(2);
  const auto errors = verify(group, [](int rank) {
    auto state = model_state();
    if (rank == 1) state[0].tensor = at::zeros({2, 3}, at::kDouble);
    return state;
  });
  EXPECT_EQ(error_of(errors, 1),
            "parameter 'weight' is Double [2, 3] on rank 1 but rank 0 has a parameter Float "
            "[2, 3] there" +
                kFix);
}

TEST(VerifySameTensors, AParameterWhereRank0HasABufferIsADifference) {
  ThreadGroup group(2);
  const auto errors = verify(group, [](int rank) {
    auto state = model_state();
    if (rank == 1) state[1].kind = "buffer";
    return state;
  });
  EXPECT_EQ(
      error_of(errors, 1),
      "buffer 'bias' is Float [3] on rank 1 but rank 0 has a parameter Float [3] there" + kFix);
  EXPECT_NE(error_of(errors, 0).find("rank(s) 1 built a different model"), std::string::npos);
}

TEST(VerifySameTensors, OnlyTheFirstDifferenceIsNamed) {
  ThreadGroup group(2);
  const auto errors = verify(group, [](int rank) {
    auto state = model_state();
    if (rank == 1) {
      state[1].tensor = at::zeros({4});
      state[2].tensor = at::zeros({1}, at::kLong);
    }
    return state;
  });
  EXPECT_EQ(
      error_of(errors, 1),
      "parameter 'bias' is Float [4] on rank 1 but rank 0 has a parameter Float [3] there" + kFix);
}

TEST(VerifySameTensors, AnExtraTensorIsNamed) {
  ThreadGroup group(2);
  const auto errors = verify(group, [](int rank) {
    auto state = model_state();
    if (rank == 1) state.push_back({"buffer", "extra", at::zeros({2, 2}, at::kInt)});
    return state;
  });
  EXPECT_EQ(error_of(errors, 1),
            "buffer 'extra' (Int [2, 2]) exists on rank 1 but rank 0 has only 3 parameters and "
            "buffers" +
                kFix);
  EXPECT_NE(error_of(errors, 0).find("rank(s) 1 built a different model"), std::string::npos);
}

TEST(VerifySameTensors, AMissingTensorNamesWhatRank0HasNext) {
  ThreadGroup group(2);
  const auto errors = verify(group, [](int rank) {
    auto state = model_state();
    if (rank == 1) state.pop_back();
    return state;
  });
  EXPECT_EQ(error_of(errors, 1),
            "rank 1 has 2 parameters and buffers but rank 0 has more (the next is a buffer Long "
            "[4])" +
                kFix);
}

TEST(VerifySameTensors, EveryDifferingRankIsListed) {
  ThreadGroup group(4);
  const auto errors = verify(group, [](int rank) {
    auto state = model_state();
    if (rank == 1 || rank == 3) state[0].tensor = at::zeros({3, 2});
    return state;
  });
  const std::string others =
      "rank(s) 1, 3 built a different model than rank 0 (see their error for the first "
      "difference)" +
      kFix;
  EXPECT_EQ(error_of(errors, 0), others);
  EXPECT_EQ(error_of(errors, 2), others);
  for (int r : {1, 3}) {
    EXPECT_EQ(error_of(errors, r), "parameter 'weight' is Float [3, 2] on rank " +
                                       std::to_string(r) +
                                       " but rank 0 has a parameter Float [2, 3] there" + kFix);
  }
}

TEST(VerifySameTensors, ScalarTensorsAreDescribedWithNoDimensions) {
  ThreadGroup group(2);
  const auto errors = verify(group, [](int rank) {
    std::vector<NamedTensor> state{
        {"buffer", "steps", rank == 0 ? at::zeros({}, at::kLong) : at::zeros({1}, at::kLong)}};
    return state;
  });
  EXPECT_EQ(error_of(errors, 1),
            "buffer 'steps' is Long [1] on rank 1 but rank 0 has a buffer Long [] there" + kFix);
}

// Rank `rank`'s tensors, one of each dtype the wire groups: values distinct per rank and tensor.
std::vector<at::Tensor> broadcast_state(int rank) {
  const double base = 100.0 * rank;
  at::Tensor weight = (at::arange(6, at::kFloat) + base).reshape({2, 3}).requires_grad_();
  at::Tensor transposed = at::zeros({3, 2}).t();  // non-contiguous: filled through its strides
  transposed.copy_((at::arange(6, at::kFloat) * 2 + base).reshape({2, 3}));
  return {weight,
          transposed,
          at::arange(3, at::kDouble) + base + 0.25,
          at::arange(2, at::kLong) + 1000 * rank,
          (rank == 0 ? at::tensor({1, 0, 1}) : at::tensor({0, 1, 0})).to(at::kBool),
          rank == 0 ? at::tensor({-5, 7, -128, 127}, at::kChar) : at::zeros({4}, at::kChar),
          (at::arange(2, at::kFloat) + base + 0.5).to(at::kHalf),
          (at::arange(2, at::kFloat) + base + 1.5).to(at::kBFloat16),
          at::tensor({rank + 11, rank + 12}, at::kInt)};
}

TEST(BroadcastFromRank0, EveryRankEndsWithRank0sValues) {
  ThreadGroup group(3);
  std::vector<std::vector<at::Tensor>> after(3);
  std::vector<bool> still_leaf_requiring_grad(3);
  const auto errors = group.run([&](Communicator& comm) {
    auto state = broadcast_state(comm.rank());
    broadcast_from_rank0(state, comm);
    still_leaf_requiring_grad[comm.rank()] = state[0].is_leaf() && state[0].requires_grad();
    for (const auto& t : state) after[comm.rank()].push_back(t.detach().clone());
  });
  ASSERT_EQ(failures(errors), "");
  const auto expected = broadcast_state(0);
  for (int r = 0; r < 3; ++r) {
    ASSERT_EQ(after[r].size(), expected.size());
    for (std::size_t k = 0; k < expected.size(); ++k) {
      EXPECT_EQ(after[r][k].scalar_type(), expected[k].scalar_type()) << "rank " << r << " #" << k;
      EXPECT_TRUE(at::equal(after[r][k], expected[k].detach()))
          << "rank " << r << " tensor #" << k << ": " << after[r][k];
    }
    EXPECT_TRUE(still_leaf_requiring_grad[r]);
  }
}

TEST(BroadcastFromRank0, OneBroadcastPerWireDtypeWithOtherIntegersAsInt64) {
  ThreadGroup group(2);
  const auto errors = group.run(
      [&](Communicator& comm) { broadcast_from_rank0(broadcast_state(comm.rank()), comm); });
  ASSERT_EQ(failures(errors), "");
  // float32: 6 + 6; float64: 3; int64: 2 + 3 (bool) + 4 (int8); float16: 2; bfloat16: 2;
  // int32: 2.
  std::vector<std::pair<DataType, std::size_t>> expected{
      {DataType::kFloat32, 12}, {DataType::kFloat64, 3},  {DataType::kInt64, 9},
      {DataType::kFloat16, 2},  {DataType::kBFloat16, 2}, {DataType::kInt32, 2}};
  std::sort(expected.begin(), expected.end());
  for (int r = 0; r < 2; ++r) {
    std::vector<std::pair<DataType, std::size_t>> seen;
    for (const auto& call : group.calls(r)) {
      EXPECT_EQ(call.op, "broadcast");
      EXPECT_EQ(call.root, 0);
      seen.emplace_back(call.dtype, call.count);
    }
    std::sort(seen.begin(), seen.end());
    EXPECT_EQ(seen, expected) << "rank " << r;
  }
}

TEST(BroadcastFromRank0, NothingToSendOrNoOneToSendToIssuesNoCollective) {
  {
    ThreadGroup group(1);
    std::vector<at::Tensor> after;
    const auto errors = group.run([&](Communicator& comm) {
      after = broadcast_state(5);
      broadcast_from_rank0(after, comm);
    });
    ASSERT_EQ(failures(errors), "");
    EXPECT_TRUE(group.calls(0).empty());
    EXPECT_TRUE(at::equal(after[3], at::tensor({5000, 5001}, at::kLong)));
  }
  ThreadGroup group(3);
  const auto errors = group.run([&](Communicator& comm) { broadcast_from_rank0({}, comm); });
  ASSERT_EQ(failures(errors), "");
  for (int r = 0; r < 3; ++r) EXPECT_TRUE(group.calls(r).empty());
}

}  // namespace
}  // namespace ddp::detail
