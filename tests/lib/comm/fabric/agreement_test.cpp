// The agreement protocol's decisions (lib/src/comm/fabric/agreement.h), without a provider: which
// messages carry digests and large bits, when a header goes out, which receives wait for one, and
// what a header from an earlier, the current or a later op means.
#include "comm/fabric/agreement.h"

#include <gtest/gtest.h>

#include "comm/fabric/message_tag.h"

namespace ddp::detail::fabric {
namespace {

constexpr std::size_t kInject = 64;
constexpr std::size_t kSmall = 32;
constexpr std::size_t kLarge = 4096;

// shm: 8 bytes of CQ data, small messages carry digests.
DigestPolicy shm_policy() { return {kInject, false, true}; }
// tcp;ofi_rxm: every data message carries the digest.
DigestPolicy rxm_policy() { return {kInject, true, false}; }
// A provider without CQ data: headers only.
DigestPolicy headers_only_policy() { return {kInject, false, false}; }

CollectiveSignature allreduce(std::uint64_t count) {
  return CollectiveSignature::make(CollectiveKind::kAllreduce, DataType::kFloat32, count, 0, 0);
}

// The header `peer` would send in its op number `sequence`.
CollectiveSignature header_of(const CollectiveSignature& signature, std::uint32_t sequence) {
  CollectiveSignature header = signature;
  header.sequence = sequence;
  return header;
}

TEST(Agreement, EachPolicyDecidesDigestsAndLargeBitsFromTheSizeAlone) {
  const Agreement shm(2, shm_policy());
  EXPECT_TRUE(shm.carries_digest(kSmall));
  EXPECT_TRUE(shm.carries_digest(kInject));
  EXPECT_FALSE(shm.carries_digest(kLarge));
  EXPECT_FALSE(shm.large_message(kInject));
  EXPECT_TRUE(shm.large_message(kInject + 1));

  const Agreement rxm(2, rxm_policy());
  EXPECT_TRUE(rxm.carries_digest(kSmall));
  EXPECT_TRUE(rxm.carries_digest(kLarge));
  EXPECT_FALSE(rxm.large_message(kLarge));  // sizes may disagree: the tags must still match

  const Agreement plain(2, headers_only_policy());
  EXPECT_FALSE(plain.carries_digest(kSmall));
  EXPECT_TRUE(plain.large_message(kLarge));
}

TEST(Agreement, SenderAndReceiverTagAMessageAlikeAndEachOpApart) {
  Agreement sender(2, shm_policy());
  Agreement receiver(2, shm_policy());
  (void)sender.begin_op(allreduce(8));
  (void)receiver.begin_op(allreduce(8));
  EXPECT_EQ(sender.data_tag(0, 3, kLarge), receiver.data_tag(0, 3, kLarge));
  EXPECT_NE(sender.data_tag(0, 3, kLarge), sender.data_tag(0, 3, kSmall));  // the large bit
  EXPECT_NE(sender.data_tag(0, 3, kSmall), sender.data_tag(1, 3, kSmall));
  const std::uint64_t first_op = sender.data_tag(0, 3, kSmall);
  sender.end_op();
  (void)sender.begin_op(allreduce(8));
  EXPECT_NE(sender.data_tag(0, 3, kSmall), first_op);
  // An index that reaches the header's wraps below it: data never lands on a header channel.
  EXPECT_NE(sender.data_tag(0, kHeaderIndex, kSmall), Agreement::header_tag(0));
  EXPECT_EQ(decode_tag(Agreement::header_tag(1)).source, 1u);
  EXPECT_EQ(decode_tag(Agreement::header_tag(1)).index, kHeaderIndex);
}

TEST(Agreement, TheDigestCheckNeedsTheOpsOwnDigest) {
  Agreement agreement(2, shm_policy());
  (void)agreement.begin_op(allreduce(8));
  const std::uint64_t mine = agreement.digest();
  EXPECT_EQ(mine, header_of(allreduce(8), 1).digest());
  EXPECT_TRUE(agreement.digest_matches(kSmall, true, mine));
  EXPECT_FALSE(agreement.digest_matches(kSmall, true, allreduce(9).digest()));
  EXPECT_FALSE(agreement.digest_matches(kSmall, false, 0));  // a small message without one
  EXPECT_TRUE(agreement.digest_matches(kLarge, false, 0));   // its header was checked instead
}

TEST(Agreement, AHeaderGoesAheadOfALargeMessageOnceAndAheadOfASmallOneToAPeerNotSending) {
  Agreement agreement(3, shm_policy());
  (void)agreement.begin_op(allreduce(8));
  // Peer 1: this rank receives from it first, so a small send needs no header.
  EXPECT_TRUE(agreement.receive_ready(1, 0, kSmall));
  EXPECT_FALSE(agreement.header_due_before_send(1, kSmall));
  EXPECT_TRUE(agreement.header_due_before_send(1, kLarge));
  EXPECT_FALSE(agreement.header_due_before_send(1, kLarge));  // once per op
  // Peer 2 sends nothing to this rank (yet): it may expect a large message.
  EXPECT_TRUE(agreement.header_due_before_send(2, kSmall));
  agreement.end_op();
  (void)agreement.begin_op(allreduce(8));
  EXPECT_TRUE(agreement.header_due_before_send(1, kLarge));  // a new op: a new header
}

TEST(Agreement, OverRxmNoHeaderPrecedesDataButASlowWaitProbesOnce) {
  Agreement agreement(2, rxm_policy());
  (void)agreement.begin_op(allreduce(1 << 20));
  EXPECT_FALSE(agreement.header_due_before_send(1, kLarge));
  EXPECT_TRUE(agreement.receive_ready(1, 0, kLarge));  // digests: posted at once
  EXPECT_TRUE(agreement.probe_due(1));
  EXPECT_FALSE(agreement.probe_due(1));
  agreement.end_op();
  (void)agreement.begin_op(allreduce(1 << 20));
  EXPECT_TRUE(agreement.probe_due(1));
}

TEST(Agreement, AProbeIsNotDueToAPeerTheHeaderAlreadyWentTo) {
  Agreement agreement(2, headers_only_policy());
  (void)agreement.begin_op(allreduce(8));
  EXPECT_TRUE(agreement.header_due_before_send(1, kSmall));
  EXPECT_FALSE(agreement.probe_due(1));
}

TEST(Agreement, ALargeReceiveWaitsForTheHeaderThatAgrees) {
  Agreement agreement(2, shm_policy());
  const CollectiveSignature op = allreduce(1024);
  (void)agreement.begin_op(op);
  EXPECT_FALSE(agreement.receive_ready(1, 7, kLarge));
  EXPECT_FALSE(agreement.receive_ready(1, 8, kLarge));
  EXPECT_TRUE(agreement.receive_ready(1, 9, kSmall));  // a digest: posted at once
  EXPECT_TRUE(agreement.ready_receives().empty());
  EXPECT_EQ(agreement.take_header(1, header_of(op, 1)), Agreement::Verdict::kAgrees);
  EXPECT_EQ(agreement.ready_receives(), (std::vector<Agreement::Request>{7, 8}));
  EXPECT_EQ(agreement.header_reposts(), std::vector<int>{1});
  // Once the header agreed, later large receives from that peer go at once.
  EXPECT_TRUE(agreement.receive_ready(1, 10, kLarge));
}

TEST(Agreement, ADisagreeingHeaderFailsTheOpAndReleasesNothing) {
  Agreement agreement(2, shm_policy());
  (void)agreement.begin_op(allreduce(1024));
  EXPECT_FALSE(agreement.receive_ready(1, 7, kLarge));
  EXPECT_EQ(agreement.take_header(1, header_of(allreduce(2048), 1)),
            Agreement::Verdict::kDisagrees);
  EXPECT_TRUE(agreement.ready_receives().empty());
  EXPECT_TRUE(agreement.header_reposts().empty());
}

TEST(Agreement, AHeaderForALaterOpWaitsForThatOp) {
  Agreement agreement(2, shm_policy());
  const CollectiveSignature op = allreduce(1024);
  (void)agreement.begin_op(op);
  EXPECT_EQ(agreement.take_header(1, header_of(op, 2)), Agreement::Verdict::kLater);
  EXPECT_TRUE(agreement.header_reposts().empty());  // the channel stays unposted
  agreement.end_op();
  // Its peer is handed back at the next op, where the header now agrees.
  EXPECT_EQ(agreement.begin_op(op), std::vector<int>{1});
  EXPECT_EQ(agreement.take_header(1, header_of(op, 2)), Agreement::Verdict::kAgrees);
  EXPECT_TRUE(agreement.receive_ready(1, 0, kLarge));
}

TEST(Agreement, AHeaderBetweenOpsWaitsAndOneForACompletedOpIsDropped) {
  Agreement agreement(2, shm_policy());
  const CollectiveSignature op = allreduce(1024);
  (void)agreement.begin_op(op);
  agreement.end_op();
  // The peer's op 1 header arriving after this rank's op 1 completed: nothing left to protect.
  EXPECT_EQ(agreement.take_header(1, header_of(op, 0)), Agreement::Verdict::kEarlier);
  EXPECT_EQ(agreement.header_reposts(), std::vector<int>{1});
  // The header of the op this rank just completed, arriving between ops, cannot be checked
  // outside an op: it is kept, and the next op finds it earlier than itself and drops it.
  EXPECT_EQ(agreement.take_header(1, header_of(op, 1)), Agreement::Verdict::kLater);
  EXPECT_EQ(agreement.begin_op(op), std::vector<int>{1});
  EXPECT_EQ(agreement.take_header(1, header_of(op, 1)), Agreement::Verdict::kEarlier);
}

TEST(Agreement, SequencesWrapWithoutTurningAnEarlierOpIntoALaterOne) {
  Agreement agreement(2, shm_policy());
  const CollectiveSignature op = allreduce(8);
  (void)agreement.begin_op(op);
  // A header numbered far ahead in 32-bit arithmetic is from before (the counter wrapped).
  EXPECT_EQ(agreement.take_header(1, header_of(op, 0x80000001u)), Agreement::Verdict::kEarlier);
  EXPECT_EQ(agreement.take_header(1, header_of(op, 0x7fffffffu)), Agreement::Verdict::kLater);
}

}  // namespace
}  // namespace ddp::detail::fabric
