// Unit test of lib/src/parallel/bucket_assignment.cpp: assign_buckets groups tensors per dtype,
// closing a bucket as soon as it reaches its cap (the first bucket of each dtype has its own cap),
// and returns the buckets ordered by their first tensor.
#include "parallel/bucket_assignment.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <vector>

namespace ddp::detail {
namespace {

using Buckets = std::vector<std::vector<std::size_t>>;

std::vector<TensorSlot> same_dtype(const std::vector<std::size_t>& bytes) {
  std::vector<TensorSlot> slots;
  for (std::size_t b : bytes) slots.push_back({b, 0});
  return slots;
}

TEST(AssignBuckets, NoTensorsGiveNoBuckets) { EXPECT_TRUE(assign_buckets({}, 100, 100).empty()); }

TEST(AssignBuckets, TensorsUnderTheCapShareOneBucketInOrder) {
  EXPECT_EQ(assign_buckets(same_dtype({10, 20, 30}), 1000, 1000), (Buckets{{0, 1, 2}}));
}

TEST(AssignBuckets, ABucketClosesAsSoonAsItReachesItsCap) {
  // 60 + 40 = 100 reaches the cap exactly: closed; the 10 starts the next bucket.
  EXPECT_EQ(assign_buckets(same_dtype({60, 40, 10}), 100, 100), (Buckets{{0, 1}, {2}}));
  // One byte short stays open.
  EXPECT_EQ(assign_buckets(same_dtype({60, 39, 10}), 100, 100), (Buckets{{0, 1, 2}}));
}

TEST(AssignBuckets, ABucketExceedsItsCapByAtMostOneTensor) {
  // The 500-byte tensor joins the open bucket and closes it; it is not split or isolated.
  EXPECT_EQ(assign_buckets(same_dtype({10, 500, 10}), 100, 100), (Buckets{{0, 1}, {2}}));
  // A tensor larger than the cap on its own is a bucket of its own.
  EXPECT_EQ(assign_buckets(same_dtype({500, 500}), 100, 100), (Buckets{{0}, {1}}));
}

TEST(AssignBuckets, OnlyTheFirstBucketUsesTheFirstCap) {
  // First cap 50: [60] closes at once. Then cap 200: 60 + 60 + 60 = 180 stays open, the fourth
  // 60 closes it at 240, and the last 10 is left over.
  EXPECT_EQ(assign_buckets(same_dtype({60, 60, 60, 60, 60, 10}), 50, 200),
            (Buckets{{0}, {1, 2, 3, 4}, {5}}));
}

TEST(AssignBuckets, DtypesNeverShareABucketAndEachHasItsOwnFirstCap) {
  const int a = 6, b = 7;
  // First cap 150, cap 250. a: 0 + 1 = 200 closes a's first bucket; b: 2 + 3 = 200 closes b's
  // first bucket too (its own first cap); a: 4 + 5 = 200 < 250 stays open until 6 makes 300.
  const std::vector<TensorSlot> slots{{100, a}, {100, a}, {100, b}, {100, b},
                                      {100, a}, {100, a}, {100, a}};
  EXPECT_EQ(assign_buckets(slots, 150, 250), (Buckets{{0, 1}, {2, 3}, {4, 5, 6}}));

  // Interleaved dtypes: each bucket takes only its own dtype's tensors.
  const std::vector<TensorSlot> interleaved{{100, a}, {100, b}, {100, a}, {100, b}, {50, a}};
  EXPECT_EQ(assign_buckets(interleaved, 150, 150), (Buckets{{0, 2}, {1, 3}, {4}}));
}

TEST(AssignBuckets, BucketsComeBackOrderedByTheirFirstTensor) {
  // The float64 bucket [1, 2] closes first, but the float32 bucket left open holds tensor 0.
  const std::vector<TensorSlot> slots{{10, 0}, {100, 1}, {100, 1}};
  EXPECT_EQ(assign_buckets(slots, 150, 150), (Buckets{{0}, {1, 2}}));
}

TEST(AssignBuckets, ZeroCapsGiveOneBucketPerTensor) {
  EXPECT_EQ(assign_buckets(same_dtype({4, 0, 8}), 0, 0), (Buckets{{0}, {1}, {2}}));
}

TEST(AssignBuckets, EmptyTensorsJoinTheOpenBucket) {
  EXPECT_EQ(assign_buckets(same_dtype({0, 0, 40, 0}), 40, 40), (Buckets{{0, 1, 2}, {3}}));
}

// The rules checked bucket by bucket on a large pseudo-random input.
TEST(AssignBuckets, EveryTensorLandsInExactlyOneBucketThatFollowsTheRules) {
  constexpr std::size_t kCount = 300;
  constexpr std::size_t kFirstCap = 700, kCap = 2000;
  std::vector<TensorSlot> slots;
  std::uint64_t state = 12345;
  for (std::size_t i = 0; i < kCount; ++i) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    slots.push_back({static_cast<std::size_t>((state >> 33) % 900), static_cast<int>(state % 3)});
  }
  const Buckets buckets = assign_buckets(slots, kFirstCap, kCap);

  std::vector<int> seen(kCount, 0);
  std::map<int, std::vector<std::size_t>> bytes_per_dtype;  // each bucket's bytes, in order
  for (std::size_t k = 0; k < buckets.size(); ++k) {
    const auto& bucket = buckets[k];
    ASSERT_FALSE(bucket.empty());
    if (k > 0) {
      EXPECT_LT(buckets[k - 1].front(), bucket.front()) << "bucket " << k;
    }
    const int dtype = slots[bucket.front()].dtype;
    std::size_t bytes = 0;
    for (std::size_t j = 0; j < bucket.size(); ++j) {
      ++seen[bucket[j]];
      EXPECT_EQ(slots[bucket[j]].dtype, dtype) << "bucket " << k << " mixes dtypes";
      if (j > 0) {
        EXPECT_LT(bucket[j - 1], bucket[j]) << "bucket " << k << " out of order";
      }
      bytes += slots[bucket[j]].bytes;
    }
    const std::size_t cap = bytes_per_dtype[dtype].empty() ? kFirstCap : kCap;
    // Under the cap before its last tensor: it was not closed too late.
    EXPECT_LT(bytes - slots[bucket.back()].bytes, cap) << "bucket " << k;
    bytes_per_dtype[dtype].push_back(bytes);
  }
  for (std::size_t i = 0; i < kCount; ++i) EXPECT_EQ(seen[i], 1) << "tensor " << i;
  ASSERT_EQ(bytes_per_dtype.size(), 3u) << "expected buckets of all three dtypes";
  // Every bucket of a dtype but its last reached its cap (only the last one may be left open).
  for (const auto& [dtype, bytes] : bytes_per_dtype) {
    for (std::size_t k = 0; k + 1 < bytes.size(); ++k) {
      EXPECT_GE(bytes[k], k == 0 ? kFirstCap : kCap) << "dtype " << dtype << " bucket " << k;
    }
  }
}

}  // namespace
}  // namespace ddp::detail
