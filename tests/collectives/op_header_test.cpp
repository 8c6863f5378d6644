// The op header tells apart the mismatches ranks actually make, and the plan fingerprint follows
// exactly the settings that shape messages.
#include "comm/collectives/op_header.h"

#include <gtest/gtest.h>

#include "comm/collectives/algorithm_config.h"

namespace ddp::detail::collectives {
namespace {

TEST(OpHeader, AgreementNeedsTheSameCallAndTheSameSettings) {
  auto header = [](std::uint64_t count, std::uint64_t plan) {
    return OpHeader{CollectiveSignature::make(CollectiveKind::kAllreduce, DataType::kFloat32, count,
                                              static_cast<std::uint32_t>(ReduceOp::kSum), 3),
                    plan};
  };
  EXPECT_EQ(op_header_mismatch(header(64, 1), header(64, 1), 2), "");
  const std::string size = op_header_mismatch(header(64, 1), header(67, 1), 2);
  EXPECT_NE(size.find("rank 2 issued allreduce(sum, float32 x 67, #3)"), std::string::npos) << size;
  const std::string plan = op_header_mismatch(header(64, 1), header(64, 2), 2);
  EXPECT_NE(plan.find("DDP_FABRIC_"), std::string::npos) << plan;
}

TEST(OpHeader, PlanFingerprintFollowsTheSettingsThatShapeMessages) {
  AlgorithmConfig a;
  AlgorithmConfig b = a;
  b.pipeline_depth = a.pipeline_depth + 3;  // depth does not change any message
  EXPECT_EQ(a.fingerprint(), b.fingerprint());
  b.chunk_bytes = a.chunk_bytes * 2;
  EXPECT_NE(a.fingerprint(), b.fingerprint());
  AlgorithmConfig c = a;
  c.allreduce = AllreduceAlgorithm::kRing;
  EXPECT_NE(a.fingerprint(), c.fingerprint());
  AlgorithmConfig d = a;
  d.min_chunk_bytes = 4096;
  EXPECT_NE(a.fingerprint(), d.fingerprint());
}

}  // namespace
}  // namespace ddp::detail::collectives
