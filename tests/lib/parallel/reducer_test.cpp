// Unit test of lib/src/parallel/reducer.cpp: the gradient side of DistributedDataParallel, driven
// by real autograd backward passes on ranks that are threads of this process (thread_group.h).
// Bucket layout and aliasing, one averaging allreduce per bucket in index order whatever order
// the gradients arrive in, the overlap statistics, unused parameters, sync disabled, bf16
// compression, existing gradients, channels-last parameters, rejected parameters, a gradient
// reported twice, a failed allreduce, and a destroyed reducer.
#include "parallel/reducer.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "ddp/error.h"
#include "thread_group.h"

namespace ddp::detail {
namespace {

using testing::failures;
using testing::RecordedCollective;
using testing::ThreadGroup;
using Names = std::vector<std::string>;

// Parameters a..e, registered in this order, float32:
//   a [50] 200 B, b [10, 10] 400 B, c [25] 100 B, d [3, 50] 600 B, e [10] 40 B.
// In reverse registration order, with a first cap of 400 B and a cap of 500 B, the buckets are
// [e, d] (40 + 600 = 640 B reaches 400), [c, b] (100 + 400 = 500 B reaches 500) and [a] (200 B,
// left open at the end).
const Names kNames{"a", "b", "c", "d", "e"};
const std::vector<std::vector<int64_t>> kShapes{{50}, {10, 10}, {25}, {3, 50}, {10}};
constexpr std::size_t kA = 0, kB = 1, kC = 2, kD = 3, kE = 4;

DdpOptions small_caps() {
  DdpOptions options;
  options.first_bucket_cap_bytes = 400;
  options.bucket_cap_bytes = 500;
  return options;
}

struct Model {
  std::vector<at::Tensor> params;

  Model() {
    for (const auto& shape : kShapes) params.push_back(at::zeros(shape).requires_grad_());
  }
  std::vector<Reducer::Parameter> parameters() const {
    std::vector<Reducer::Parameter> list;
    for (std::size_t k = 0; k < params.size(); ++k) list.push_back({kNames[k], params[k]});
    return list;
  }
};

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// The gradient parameter k gets on `rank` from loss(): 0, 1, 2, ... plus 1000 k plus 8 rank.
at::Tensor local_gradient(std::size_t k, int rank) {
  return (at::arange(numel_of(kShapes[k]), at::kFloat) + 1000.0 * static_cast<double>(k) +
          8.0 * rank)
      .reshape(kShapes[k]);
}

// The mean of local_gradient(k, r) over ranks 0 .. size - 1 (8 r averages to 4 (size - 1)).
at::Tensor mean_gradient(std::size_t k, int size) {
  return (at::arange(numel_of(kShapes[k]), at::kFloat) + 1000.0 * static_cast<double>(k) +
          4.0 * (size - 1))
      .reshape(kShapes[k]);
}

// The sum over `order` of (p_k * local_gradient(k, rank)).sum(), built in that order.
at::Tensor loss(const Model& m, int rank, const std::vector<std::size_t>& order) {
  at::Tensor total;
  for (std::size_t k : order) {
    at::Tensor term = (m.params[k] * local_gradient(k, rank)).sum();
    total = total.defined() ? total + term : term;
  }
  return total;
}

const std::vector<std::size_t> kForward{kA, kB, kC, kD, kE};

// Bucket k's flat buffer starts at the gradient of its first parameter: e, c, a.
const std::vector<std::size_t> kBucketStart{kE, kC, kA};
const std::vector<std::size_t> kBucketElements{10 + 150, 25 + 100, 50};

// The flattened local gradients of bucket `bucket`'s parameters, in bucket order.
at::Tensor bucket_input(std::size_t bucket, int rank) {
  const std::vector<std::vector<std::size_t>> members{{kE, kD}, {kC, kB}, {kA}};
  std::vector<at::Tensor> pieces;
  for (std::size_t k : members[bucket]) pieces.push_back(local_gradient(k, rank).flatten());
  return at::cat(pieces);
}

struct RankResult {
  std::vector<at::Tensor> grads;
  std::vector<const void*> bucket_starts;
  BackwardStats stats;
  std::vector<RecordedCollective> calls;
};

void record(const Model& m, const Reducer& reducer, RankResult& out) {
  for (const auto& p : m.params) out.grads.push_back(p.grad().clone());
  for (std::size_t k : kBucketStart) out.bucket_starts.push_back(m.params[k].grad().data_ptr());
  out.stats = reducer.last_backward();
}

// Expects the three allreduces of one backward pass, in bucket order, averaging float32.
void expect_bucket_allreduces(const std::vector<RecordedCollective>& calls,
                              const RankResult& result, int rank) {
  ASSERT_EQ(calls.size(), 3u) << "rank " << rank;
  for (std::size_t b = 0; b < 3; ++b) {
    SCOPED_TRACE("rank " + std::to_string(rank) + " bucket " + std::to_string(b));
    EXPECT_EQ(calls[b].op, "allreduce");
    EXPECT_EQ(calls[b].reduce, ReduceOp::kAvg);
    EXPECT_EQ(calls[b].dtype, DataType::kFloat32);
    EXPECT_EQ(calls[b].count, kBucketElements[b]);
    EXPECT_EQ(calls[b].data, result.bucket_starts[b]);
    EXPECT_TRUE(at::equal(calls[b].input, bucket_input(b, rank))) << "not this rank's gradients";
  }
}

TEST(Reducer, BucketsFollowReverseRegistrationOrderAndCaps) {
  ThreadGroup group(1);
  std::vector<BucketInfo> infos;
  std::vector<at::Tensor> grads;
  at::Tensor frozen = at::zeros({7});  // does not require grad: no bucket
  BackwardStats before;
  const auto errors = group.run([&](Communicator& comm) {
    Model m;
    auto parameters = m.parameters();
    parameters.insert(parameters.begin() + 2, {"frozen", frozen});
    Reducer reducer(parameters, comm, small_caps());
    infos = reducer.bucket_infos();
    before = reducer.last_backward();
    for (const auto& p : m.params) grads.push_back(p.grad());
  });
  ASSERT_EQ(failures(errors), "");
  ASSERT_EQ(infos.size(), 3u);
  EXPECT_EQ(infos[0].parameters, (Names{"e", "d"}));
  EXPECT_EQ(infos[0].bytes, 640u);
  EXPECT_EQ(infos[1].parameters, (Names{"c", "b"}));
  EXPECT_EQ(infos[1].bytes, 500u);
  EXPECT_EQ(infos[2].parameters, (Names{"a"}));
  EXPECT_EQ(infos[2].bytes, 200u);
  EXPECT_FALSE(frozen.grad().defined());
  EXPECT_EQ(before.buckets, 0) << "no backward yet";

  // Each gradient is a zeroed alias into its bucket, the bucket's members back to back.
  for (std::size_t k = 0; k < grads.size(); ++k) {
    ASSERT_TRUE(grads[k].defined()) << kNames[k];
    EXPECT_EQ(grads[k].sizes(), at::IntArrayRef(kShapes[k])) << kNames[k];
    EXPECT_TRUE(at::equal(grads[k], at::zeros(kShapes[k]))) << kNames[k];
    EXPECT_FALSE(grads[k].requires_grad()) << kNames[k];
  }
  const auto address = [&](std::size_t k) { return static_cast<const char*>(grads[k].data_ptr()); };
  EXPECT_EQ(address(kD), address(kE) + 10 * sizeof(float));
  EXPECT_EQ(address(kB), address(kC) + 25 * sizeof(float));
  EXPECT_TRUE(grads[kE].storage().is_alias_of(grads[kD].storage()));
  EXPECT_FALSE(grads[kE].storage().is_alias_of(grads[kC].storage()));
}

TEST(Reducer, EachDtypeGetsBucketsOfItsOwn) {
  ThreadGroup group(1);
  std::vector<BucketInfo> infos;
  const auto errors = group.run([&](Communicator& comm) {
    // Reverse order f2, x, f1: the float32 pair shares a bucket, x (float64) has its own.
    std::vector<Reducer::Parameter> parameters{{"f1", at::zeros({10}).requires_grad_()},
                                               {"x", at::zeros({5}, at::kDouble).requires_grad_()},
                                               {"f2", at::zeros({10}).requires_grad_()}};
    Reducer reducer(parameters, comm, DdpOptions{});
    infos = reducer.bucket_infos();
  });
  ASSERT_EQ(failures(errors), "");
  ASSERT_EQ(infos.size(), 2u);
  EXPECT_EQ(infos[0].parameters, (Names{"f2", "f1"}));
  EXPECT_EQ(infos[0].bytes, 80u);
  EXPECT_EQ(infos[1].parameters, (Names{"x"}));
  EXPECT_EQ(infos[1].bytes, 40u);
}

TEST(Reducer, BackwardAveragesEveryBucketOnceInIndexOrder) {
  ThreadGroup group(2);
  std::vector<RankResult> results(2);
  const auto errors = group.run([&](Communicator& comm) {
    Model m;
    Reducer reducer(m.parameters(), comm, small_caps());
    loss(m, comm.rank(), kForward).backward();
    record(m, reducer, results[comm.rank()]);
  });
  ASSERT_EQ(failures(errors), "");
  for (int r = 0; r < 2; ++r) {
    expect_bucket_allreduces(group.calls(r), results[r], r);
    for (std::size_t k = 0; k < kNames.size(); ++k) {
      EXPECT_TRUE(at::equal(results[r].grads[k], mean_gradient(k, 2)))
          << "rank " << r << " parameter " << kNames[k];
    }
    EXPECT_EQ(results[r].stats.buckets, 3);
    // Every parameter got its gradient from a hook, so every bucket was launched from one.
    EXPECT_EQ(results[r].stats.launched_during_backward, 3);
    EXPECT_GE(results[r].stats.wait_seconds, 0.0);
  }
}

TEST(Reducer, GradientsArrivingInEitherOrderGiveTheSameCollectives) {
  ThreadGroup group(2);
  std::vector<std::vector<at::Tensor>> grads(4);  // [order * 2 + rank]
  std::vector<std::string> first_ready(4);
  const auto errors = group.run([&](Communicator& comm) {
    const std::vector<std::vector<std::size_t>> orders{kForward, {kE, kD, kC, kB, kA}};
    for (std::size_t o = 0; o < orders.size(); ++o) {
      Model m;
      Reducer reducer(m.parameters(), comm, small_caps());
      std::vector<std::string> ready;
      for (std::size_t k = 0; k < m.params.size(); ++k) {
        m.params[k].register_hook([&ready, k](const at::Tensor&) { ready.push_back(kNames[k]); });
      }
      loss(m, comm.rank(), orders[o]).backward();
      const std::size_t slot = o * 2 + static_cast<std::size_t>(comm.rank());
      first_ready[slot] = ready.empty() ? "" : ready.front();
      for (const auto& p : m.params) grads[slot].push_back(p.grad().clone());
    }
  });
  ASSERT_EQ(failures(errors), "");
  // The premise: the two forward orders made backward produce the gradients in other orders.
  EXPECT_NE(first_ready[0], first_ready[2]);
  for (int r = 0; r < 2; ++r) {
    const auto calls = group.calls(r);
    ASSERT_EQ(calls.size(), 6u);
    for (std::size_t b = 0; b < 3; ++b) {
      EXPECT_EQ(calls[b].count, kBucketElements[b]) << "rank " << r << " bucket " << b;
      EXPECT_EQ(calls[3 + b].count, kBucketElements[b]) << "rank " << r << " bucket " << b;
      EXPECT_TRUE(at::equal(calls[3 + b].input, bucket_input(b, r)));
    }
    for (std::size_t k = 0; k < kNames.size(); ++k) {
      EXPECT_TRUE(at::equal(grads[2 + r][k], mean_gradient(k, 2))) << kNames[k];
      EXPECT_TRUE(at::equal(grads[r][k], grads[2 + r][k])) << kNames[k];
    }
  }
}

TEST(Reducer, AParameterWithoutGradientOnOneRankContributesZeros) {
  ThreadGroup group(2);
  std::vector<RankResult> results(2);
  const auto errors = group.run([&](Communicator& comm) {
    Model m;
    Reducer reducer(m.parameters(), comm, small_caps());
    // Rank 1 does not use a, the only member of the last bucket.
    const auto order = comm.rank() == 0 ? kForward : std::vector<std::size_t>{kB, kC, kD, kE};
    loss(m, comm.rank(), order).backward();
    record(m, reducer, results[comm.rank()]);
  });
  ASSERT_EQ(failures(errors), "");
  // a: rank 0's 0, 1, 2, ... averaged with rank 1's zeros.
  const at::Tensor half = at::arange(50, at::kFloat) / 2;
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(at::equal(results[r].grads[kA], half)) << "rank " << r;
    for (std::size_t k : {kB, kC, kD, kE}) {
      EXPECT_TRUE(at::equal(results[r].grads[k], mean_gradient(k, 2))) << kNames[k];
    }
    EXPECT_EQ(group.calls(r).size(), 3u);
  }
  EXPECT_EQ(results[0].stats.launched_during_backward, 3);
  // Rank 1's last bucket was completed (with zeros) and launched after backward.
  EXPECT_EQ(results[1].stats.launched_during_backward, 2);
}

TEST(Reducer, BucketsLaunchStrictlyInIndexOrder) {
  ThreadGroup group(2);
  std::vector<RankResult> results(2);
  const auto errors = group.run([&](Communicator& comm) {
    Model m;
    Reducer reducer(m.parameters(), comm, small_caps());
    // e (in bucket 0) is unused everywhere: bucket 0 completes only after backward, and the
    // complete buckets 1 and 2 must wait for it.
    loss(m, comm.rank(), {kA, kB, kC, kD}).backward();
    record(m, reducer, results[comm.rank()]);
  });
  ASSERT_EQ(failures(errors), "");
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(results[r].stats.launched_during_backward, 0) << "rank " << r;
    EXPECT_EQ(results[r].stats.buckets, 3);
    const auto calls = group.calls(r);
    ASSERT_EQ(calls.size(), 3u);
    for (std::size_t b = 0; b < 3; ++b) EXPECT_EQ(calls[b].count, kBucketElements[b]);
    EXPECT_TRUE(at::equal(results[r].grads[kE], at::zeros({10})));
    EXPECT_TRUE(at::equal(results[r].grads[kD], mean_gradient(kD, 2)));
  }
}

TEST(Reducer, WithoutOverlapEveryBucketIsLaunchedAfterBackward) {
  ThreadGroup group(2);
  std::vector<RankResult> results(2);
  const auto errors = group.run([&](Communicator& comm) {
    Model m;
    DdpOptions options = small_caps();
    options.overlap = false;
    Reducer reducer(m.parameters(), comm, options);
    loss(m, comm.rank(), kForward).backward();
    record(m, reducer, results[comm.rank()]);
  });
  ASSERT_EQ(failures(errors), "");
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(results[r].stats.launched_during_backward, 0);
    EXPECT_EQ(results[r].stats.buckets, 3);
    expect_bucket_allreduces(group.calls(r), results[r], r);
    for (std::size_t k = 0; k < kNames.size(); ++k) {
      EXPECT_TRUE(at::equal(results[r].grads[k], mean_gradient(k, 2))) << kNames[k];
    }
  }
}

TEST(Reducer, WithSyncOffGradientsAccumulateLocallyUntilTheNextSyncedBackward) {
  ThreadGroup group(2);
  std::vector<std::vector<at::Tensor>> unsynced(2), synced(2);
  std::vector<std::size_t> calls_while_off(2);
  std::vector<bool> same_memory(2);
  const auto errors = group.run([&](Communicator& comm) {
    const int r = comm.rank();
    Model m;
    Reducer reducer(m.parameters(), comm, small_caps());
    const void* before = m.params[kD].grad().data_ptr();
    reducer.set_sync(false);
    loss(m, r, kForward).backward();
    loss(m, r, kForward).backward();
    calls_while_off[r] = group.calls(r).size();
    same_memory[r] = m.params[kD].grad().data_ptr() == before;
    for (const auto& p : m.params) unsynced[r].push_back(p.grad().clone());
    reducer.set_sync(true);
    loss(m, r, kForward).backward();
    for (const auto& p : m.params) synced[r].push_back(p.grad().clone());
  });
  ASSERT_EQ(failures(errors), "");
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(calls_while_off[r], 0u) << "rank " << r << " communicated with sync off";
    EXPECT_TRUE(same_memory[r]) << "the gradient left its bucket";
    EXPECT_EQ(group.calls(r).size(), 3u);
    for (std::size_t k = 0; k < kNames.size(); ++k) {
      EXPECT_TRUE(at::equal(unsynced[r][k], 2 * local_gradient(k, r))) << kNames[k];
      // Three passes accumulated, then averaged: 3 (0, 1, 2, ... + 1000 k) + 3 * 4.
      EXPECT_TRUE(at::equal(synced[r][k], 3 * mean_gradient(k, 2))) << kNames[k];
    }
  }
}

TEST(Reducer, Bf16CompressionDividesFirstThenSumsBfloat16) {
  ThreadGroup group(2);
  std::vector<at::Tensor> grads(2);
  const auto errors = group.run([&](Communicator& comm) {
    at::Tensor p = at::zeros({4}).requires_grad_();
    DdpOptions options;
    options.compression = GradientCompression::kBFloat16;
    Reducer reducer({{"p", p}}, comm, options);
    const at::Tensor w = comm.rank() == 0 ? at::tensor({257.0f, 3.0f, 1.0f, -8.0f})
                                          : at::tensor({1.0f, 5.0f, 2.0f, 8.0f});
    (p * w).sum().backward();
    grads[comm.rank()] = p.grad().clone();
  });
  ASSERT_EQ(failures(errors), "");
  // Halves: rank 0 128.5, 1.5, 0.5, -4 (128.5 is a tie in bfloat16: it rounds to even, 128);
  // rank 1 0.5, 2.5, 1, 4. Sums: 128.5 (rounds to 128 again), 4, 1.5, 0.
  const at::Tensor expected = at::tensor({128.0f, 4.0f, 1.5f, 0.0f});
  const std::vector<at::Tensor> sent{at::tensor({128.0f, 1.5f, 0.5f, -4.0f}),
                                     at::tensor({0.5f, 2.5f, 1.0f, 4.0f})};
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(at::equal(grads[r], expected)) << "rank " << r << ": " << grads[r];
    EXPECT_EQ(grads[r].scalar_type(), at::kFloat);
    const auto calls = group.calls(r);
    ASSERT_EQ(calls.size(), 1u);
    EXPECT_EQ(calls[0].dtype, DataType::kBFloat16);
    EXPECT_EQ(calls[0].reduce, ReduceOp::kSum);
    EXPECT_EQ(calls[0].count, 4u);
    EXPECT_TRUE(at::equal(calls[0].input.to(at::kFloat), sent[r])) << calls[0].input;
  }
}

TEST(Reducer, ExistingGradientsMoveIntoTheBucket) {
  ThreadGroup group(1);
  at::Tensor before, after_wrap, after_backward;
  const void* original = nullptr;
  const void* moved_to = nullptr;
  const auto errors = group.run([&](Communicator& comm) {
    at::Tensor p = at::zeros({3}).requires_grad_();
    p.mutable_grad() = at::tensor({1.0f, 2.0f, 3.0f});
    original = p.grad().data_ptr();
    Reducer reducer({{"p", p}}, comm, DdpOptions{});
    after_wrap = p.grad().clone();
    moved_to = p.grad().data_ptr();
    (p * at::tensor({10.0f, 20.0f, 30.0f})).sum().backward();
    after_backward = p.grad().clone();
  });
  ASSERT_EQ(failures(errors), "");
  EXPECT_TRUE(at::equal(after_wrap, at::tensor({1.0f, 2.0f, 3.0f})));
  EXPECT_NE(moved_to, original) << "the gradient was not moved into the bucket";
  // Backward accumulates onto it, then one rank's average is the sum itself.
  EXPECT_TRUE(at::equal(after_backward, at::tensor({11.0f, 22.0f, 33.0f})));
  const auto calls = group.calls(0);
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_TRUE(at::equal(calls[0].input, at::tensor({11.0f, 22.0f, 33.0f})));
}

TEST(Reducer, ChannelsLastParameterKeepsItsLayoutInItsBucket) {
  ThreadGroup group(2);
  std::vector<at::Tensor> p_grads(2), q_grads(2);
  std::vector<std::vector<int64_t>> strides(2), grad_strides(2);
  std::vector<std::ptrdiff_t> q_offset(2);
  const auto errors = group.run([&](Communicator& comm) {
    const int r = comm.rank();
    at::Tensor q = at::zeros({5}).requires_grad_();
    at::Tensor p = at::zeros({2, 3, 2, 2}).contiguous(at::MemoryFormat::ChannelsLast);
    p.requires_grad_();
    Reducer reducer({{"q", q}, {"p", p}}, comm, DdpOptions{});
    strides[r] = p.strides().vec();
    grad_strides[r] = p.grad().strides().vec();
    q_offset[r] = static_cast<const float*>(q.grad().data_ptr()) -
                  static_cast<const float*>(p.grad().data_ptr());
    const at::Tensor wp = at::arange(24, at::kFloat).reshape({2, 3, 2, 2}) + 8.0 * r;
    const at::Tensor wq = at::arange(5, at::kFloat) + 100.0 + 8.0 * r;
    ((p * wp).sum() + (q * wq).sum()).backward();
    p_grads[r] = p.grad().clone();
    q_grads[r] = q.grad().clone();
  });
  ASSERT_EQ(failures(errors), "");
  const at::Tensor expected_p = at::arange(24, at::kFloat).reshape({2, 3, 2, 2}) + 4.0;
  const at::Tensor expected_q = at::arange(5, at::kFloat) + 104.0;
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(strides[r], (std::vector<int64_t>{12, 1, 6, 3}));
    EXPECT_EQ(grad_strides[r], strides[r]);
    EXPECT_EQ(q_offset[r], 24) << "p fills the first 24 elements of the bucket, q follows";
    EXPECT_TRUE(at::equal(p_grads[r], expected_p));
    EXPECT_TRUE(at::equal(q_grads[r], expected_q));
    // In the bucket, p's gradient is laid out as its strides say: NHWC.
    const auto calls = group.calls(r);
    ASSERT_EQ(calls.size(), 1u);
    const at::Tensor wp = at::arange(24, at::kFloat).reshape({2, 3, 2, 2}) + 8.0 * r;
    EXPECT_TRUE(at::equal(calls[0].input.narrow(0, 0, 24), wp.permute({0, 2, 3, 1}).flatten()));
  }
}

TEST(Reducer, RejectsParametersItCannotBucket) {
  ThreadGroup group(1);
  std::string gappy_error, complex_error;
  std::size_t skipped_buckets = 99;
  const auto errors = group.run([&](Communicator& comm) {
    // Row stride 4 for rows of 2: holes between the rows.
    at::Tensor gappy = at::empty_strided({2, 2}, {4, 1}).requires_grad_();
    try {
      Reducer reducer({{"ok", at::zeros({3}).requires_grad_()}, {"gappy", gappy}}, comm, {});
    } catch (const ConfigError& e) {
      gappy_error = e.what();
    }
    try {
      Reducer reducer({{"z", at::zeros({2}, at::kComplexFloat).requires_grad_()}}, comm, {});
    } catch (const ConfigError& e) {
      complex_error = e.what();
    }
    // Neither is checked when it does not require grad: it gets no bucket.
    Reducer reducer(
        {{"gappy", at::empty_strided({2, 2}, {4, 1})}, {"ids", at::zeros({3}, at::kLong)}}, comm,
        {});
    skipped_buckets = reducer.bucket_infos().size();
  });
  ASSERT_EQ(failures(errors), "");
  EXPECT_EQ(gappy_error,
            "parameter 'gappy' is not a dense CPU tensor; DistributedDataParallel supports dense "
            "CPU parameters only");
  EXPECT_EQ(complex_error,
            "parameter 'z' has dtype ComplexFloat; gradients must be floating point");
  EXPECT_EQ(skipped_buckets, 0u);
}

// A parameter computed from others has no gradient accumulator of its own: refused up front,
// before any gradient is replaced or hook registered, so the parameters before it stay as they
// were.
TEST(Reducer, RejectsANonLeafParameterBeforeTouchingAnyOther) {
  ThreadGroup group(1);
  std::string error;
  bool first_gradient_kept = false;
  const auto errors = group.run([&](Communicator& comm) {
    at::Tensor leaf = at::zeros({3}).requires_grad_();
    leaf.mutable_grad() = at::ones({3});
    const at::Tensor kept = leaf.grad();
    at::Tensor derived = leaf * 2;
    try {
      Reducer reducer({{"leaf", leaf}, {"derived", derived}}, comm, {});
    } catch (const ConfigError& e) {
      error = e.what();
    }
    first_gradient_kept = leaf.grad().is_same(kept);
    // Backward through the leaf runs without a reducer's hook.
    (leaf * 3).sum().backward();
  });
  ASSERT_EQ(failures(errors), "");
  EXPECT_EQ(error,
            "parameter 'derived' is not a leaf tensor (it is computed from other tensors); "
            "DistributedDataParallel reduces the gradients of leaf parameters only");
  EXPECT_TRUE(first_gradient_kept);
  EXPECT_TRUE(group.calls(0).empty());
}

// A gradient reported outside a backward pass cannot queue the end-of-pass callback: that fails,
// and the next real backward pass is still reduced.
TEST(Reducer, AReportOutsideBackwardLeavesTheNextPassReduced) {
  ThreadGroup group(2);
  std::vector<std::vector<at::Tensor>> grads(2);
  std::vector<bool> threw(2, false);
  const auto errors = group.run([&](Communicator& comm) {
    Model m;
    Reducer reducer(m.parameters(), comm, small_caps());
    try {
      reducer.on_gradient_ready(0);
    } catch (const std::exception&) {
      threw[comm.rank()] = true;
    }
    loss(m, comm.rank(), kForward).backward();
    for (const auto& p : m.params) grads[comm.rank()].push_back(p.grad().clone());
  });
  ASSERT_EQ(failures(errors), "");
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(threw[r]) << "rank " << r;
    for (std::size_t k = 0; k < kNames.size(); ++k) {
      EXPECT_TRUE(at::equal(grads[r][k], mean_gradient(k, 2))) << kNames[k] << ", rank " << r;
    }
  }
}

// A post hook on a gradient accumulator that reports the gradient ready a second time.
class ReportAgain : public torch::autograd::FunctionPostHook {
 public:
  ReportAgain(Reducer& reducer, std::size_t index) : reducer_(reducer), index_(index) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override {
    reducer_.on_gradient_ready(index_);
    return outputs;
  }

 private:
  Reducer& reducer_;
  std::size_t index_;
};

TEST(Reducer, AGradientReportedTwiceInOnePassCountsOnce) {
  ThreadGroup group(2);
  std::vector<RankResult> results(2);
  const auto errors = group.run([&](Communicator& comm) {
    Model m;
    Reducer reducer(m.parameters(), comm, small_caps());
    // Runs right after the reducer's own hook on e's accumulator. d, e's bucket mate, is unused:
    // counted twice, e would complete bucket 0 during backward.
    auto accumulator = torch::autograd::impl::grad_accumulator(m.params[kE]);
    const auto key = accumulator->add_post_hook(std::make_unique<ReportAgain>(reducer, kE));
    loss(m, comm.rank(), {kA, kB, kC, kE}).backward();
    accumulator->del_post_hook(key);
    record(m, reducer, results[comm.rank()]);
  });
  ASSERT_EQ(failures(errors), "");
  for (int r = 0; r < 2; ++r) {
    // Bucket 0 waited for d until after backward, and buckets 1 and 2 waited for bucket 0.
    EXPECT_EQ(results[r].stats.launched_during_backward, 0) << "rank " << r;
    const auto calls = group.calls(r);
    ASSERT_EQ(calls.size(), 3u);
    for (std::size_t b = 0; b < 3; ++b) EXPECT_EQ(calls[b].count, kBucketElements[b]);
    for (std::size_t k : {kA, kB, kC, kE}) {
      EXPECT_TRUE(at::equal(results[r].grads[k], mean_gradient(k, 2))) << kNames[k];
    }
    EXPECT_TRUE(at::equal(results[r].grads[kD], at::zeros(kShapes[kD])));
  }
}

TEST(Reducer, AFailedAllreduceFailsBackwardAndTheNextBackwardWorks) {
  ThreadGroup group(2);
  group.fail_next(1);  // bucket 0's allreduce, on both ranks
  std::vector<std::string> failure(2);
  std::vector<RankResult> results(2);
  const auto errors = group.run([&](Communicator& comm) {
    Model m;
    Reducer reducer(m.parameters(), comm, small_caps());
    try {
      loss(m, comm.rank(), kForward).backward();
    } catch (const std::exception& e) {
      failure[comm.rank()] = e.what();
    }
    for (auto& p : m.params) p.grad().zero_();
    loss(m, comm.rank(), kForward).backward();
    record(m, reducer, results[comm.rank()]);
  });
  ASSERT_EQ(failures(errors), "");
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(failure[r].find("injected failure"), std::string::npos)
        << "rank " << r << ": backward did not fail with the allreduce's error: " << failure[r];
    const auto calls = group.calls(r);
    ASSERT_EQ(calls.size(), 6u) << "the failed pass still issues every bucket's allreduce";
    expect_bucket_allreduces(std::vector<RecordedCollective>(calls.begin() + 3, calls.end()),
                             results[r], r);
    for (std::size_t k = 0; k < kNames.size(); ++k) {
      EXPECT_TRUE(at::equal(results[r].grads[k], mean_gradient(k, 2))) << kNames[k];
    }
  }
}

TEST(Reducer, ADestroyedReducerLeavesBackwardLocal) {
  ThreadGroup group(2);
  std::vector<std::vector<at::Tensor>> grads(2);
  const auto errors = group.run([&](Communicator& comm) {
    Model m;
    { Reducer reducer(m.parameters(), comm, small_caps()); }
    loss(m, comm.rank(), kForward).backward();
    for (const auto& p : m.params) grads[comm.rank()].push_back(p.grad().clone());
  });
  ASSERT_EQ(failures(errors), "");
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(group.calls(r).empty()) << "rank " << r;
    for (std::size_t k = 0; k < kNames.size(); ++k) {
      EXPECT_TRUE(at::equal(grads[r][k], local_gradient(k, r))) << kNames[k];
    }
  }
}

}  // namespace
}  // namespace ddp::detail
