// The signature tells apart the mismatches ranks actually make: another call, or the same call
// with other settings (its plan).
#include "comm/collective_signature.h"

#include <gtest/gtest.h>

namespace ddp::detail {
namespace {

CollectiveSignature allreduce_of(std::uint64_t count, std::uint64_t plan) {
  auto signature = CollectiveSignature::make(CollectiveKind::kAllreduce, DataType::kFloat32, count,
                                             static_cast<std::uint32_t>(ReduceOp::kSum), 3);
  signature.plan = plan;
  return signature;
}

TEST(CollectiveSignature, AgreementNeedsTheSameCallAndTheSameSettings) {
  EXPECT_TRUE(allreduce_of(64, 1).agrees_with(allreduce_of(64, 1)));
  EXPECT_FALSE(allreduce_of(64, 1).agrees_with(allreduce_of(67, 1)));
  EXPECT_FALSE(allreduce_of(64, 1).agrees_with(allreduce_of(64, 2)));

  const std::string size = mismatch_message(allreduce_of(64, 1), allreduce_of(67, 1), 2);
  EXPECT_NE(size.find("rank 2 issued allreduce(sum, float32 x 67, #3)"), std::string::npos) << size;
  const std::string plan = mismatch_message(allreduce_of(64, 1), allreduce_of(64, 2), 2);
  EXPECT_NE(plan.find("other algorithm settings"), std::string::npos) << plan;
  EXPECT_NE(plan.find("DDP_ALGORITHM"), std::string::npos) << plan;
}

TEST(CollectiveSignature, ThePayloadSizeIsNotPartOfTheAgreement) {
  auto with_payload = allreduce_of(64, 1);
  with_payload.payload_bytes = 256;
  EXPECT_TRUE(with_payload.agrees_with(allreduce_of(64, 1)));
}

TEST(CollectiveSignature, TheDigestTellsApartEveryFieldThatMustAgreeButTheSequence) {
  const auto base = allreduce_of(64, 1);
  EXPECT_EQ(base.digest(), allreduce_of(64, 1).digest());
  auto later = base;
  later.sequence = 99;
  later.payload_bytes = 256;
  EXPECT_EQ(later.digest(), base.digest());
  auto kind = base;
  kind.kind = CollectiveKind::kBroadcast;
  auto dtype = base;
  dtype.dtype = static_cast<std::uint32_t>(DataType::kInt32);
  auto detail = base;
  detail.detail = static_cast<std::uint32_t>(ReduceOp::kMax);
  for (const auto& other : {kind, dtype, detail, allreduce_of(65, 1), allreduce_of(64, 2)}) {
    EXPECT_NE(other.digest(), base.digest()) << describe(other);
  }
}

}  // namespace
}  // namespace ddp::detail
