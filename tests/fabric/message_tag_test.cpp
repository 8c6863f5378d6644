// The tag layout and the op header: tag fields round-trip without bleeding into each other, and
// headers tell apart the mismatches ranks actually make.
#include "comm/fabric/message_tag.h"

#include <gtest/gtest.h>

#include <set>

#include "comm/fabric/algorithms/algorithm_config.h"
#include "comm/fabric/op_header.h"

namespace ddp::detail::fabric {
namespace {

TEST(MessageTag, FieldsRoundTripAtTheirLimits) {
  MessageTag tag;
  tag.control = true;
  tag.large = true;
  tag.sequence = (1u << kSequenceBits) - 1;
  tag.source = kMaxRanks - 1;
  tag.index = (1u << kIndexBits) - 1;
  EXPECT_EQ(encode_tag(tag), ~std::uint64_t{0});
  const MessageTag back = decode_tag(encode_tag(tag));
  EXPECT_TRUE(back.control);
  EXPECT_TRUE(back.large);
  EXPECT_EQ(back.sequence, tag.sequence);
  EXPECT_EQ(back.source, tag.source);
  EXPECT_EQ(back.index, tag.index);
}

TEST(MessageTag, OverflowingValuesWrapInsteadOfTouchingOtherFields) {
  MessageTag tag;
  tag.sequence = (1u << kSequenceBits) + 5;
  tag.index = (1u << kIndexBits) + 9;
  tag.source = 3;
  const MessageTag back = decode_tag(encode_tag(tag));
  EXPECT_FALSE(back.control);
  EXPECT_FALSE(back.large);
  EXPECT_EQ(back.sequence, 5u);
  EXPECT_EQ(back.index, 9u);
  EXPECT_EQ(back.source, 3u);
}

TEST(MessageTag, ControlReceiveMatchesAnyNoticeAndNoData) {
  MessageTag notice;
  notice.control = true;
  notice.source = 9;
  notice.sequence = 1234;
  MessageTag data;
  data.sequence = 77;
  data.source = 9;
  const std::uint64_t posted = encode_tag(MessageTag{true, 0, 0, 0});
  auto matches = [&](std::uint64_t sent) {
    return (sent | kControlIgnoreBits) == (posted | kControlIgnoreBits);
  };
  EXPECT_TRUE(matches(encode_tag(notice)));
  EXPECT_FALSE(matches(encode_tag(data)));
}

TEST(MessageTag, DataIndicesNeverTakeTheHeadersIndex) {
  for (std::uint32_t index :
       {0u, 1u, kHeaderIndex - 1, kHeaderIndex, kHeaderIndex + 1, 2 * kHeaderIndex, 0xffffffffu}) {
    EXPECT_NE(data_index(index), kHeaderIndex) << index;
  }
  EXPECT_EQ(data_index(kHeaderIndex - 1), kHeaderIndex - 1);
}

TEST(MessageTag, LargeAndSmallMessagesOfOneIndexHaveDifferentTags) {
  MessageTag small;
  small.index = 5;
  MessageTag large = small;
  large.large = true;
  EXPECT_NE(encode_tag(small), encode_tag(large));
}

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
}

}  // namespace
}  // namespace ddp::detail::fabric
