// The tag layout: tag fields round-trip without bleeding into each other.
#include "comm/fabric/message_tag.h"

#include <gtest/gtest.h>

#include <set>

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

}  // namespace
}  // namespace ddp::detail::fabric
