// Unit test of lib/src/base/error.cpp: CommError's one-line message names the op, the rank and, when
// known, the peer; DataError's names the file; both keep what they were built from; every ddp
// error is a ddp::Error and a std::runtime_error.
#include "ddp/error.h"

#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <type_traits>

namespace ddp {
namespace {

TEST(CommError, NamesTheOpTheRankAndThePeer) {
  const CommError e("allreduce", 2, 5, "connection reset");
  EXPECT_STREQ(e.what(), "allreduce failed on rank 2 (peer rank 5): connection reset");
  EXPECT_EQ(e.op(), "allreduce");
  EXPECT_EQ(e.rank(), 2);
  EXPECT_EQ(e.peer(), 5);
}

TEST(CommError, LeavesOutAnUnknownPeer) {
  const CommError e("barrier", 0, -1, "timed out after 30 s");
  EXPECT_STREQ(e.what(), "barrier failed on rank 0: timed out after 30 s");
  EXPECT_EQ(e.peer(), -1);
  // Rank 0 is a peer like any other.
  EXPECT_STREQ(CommError("broadcast", 3, 0, "gone").what(),
               "broadcast failed on rank 3 (peer rank 0): gone");
}

TEST(CommError, TimeoutErrorIsACommErrorWithTheSameMessage) {
  const TimeoutError e("allgather", 1, 4, "no data within 5000 ms");
  const CommError& base = e;
  EXPECT_STREQ(base.what(), "allgather failed on rank 1 (peer rank 4): no data within 5000 ms");
  EXPECT_EQ(base.op(), "allgather");
  EXPECT_EQ(base.peer(), 4);
}

TEST(DataError, NamesTheFileFirst) {
  const DataError e("/data/train-images.idx", "truncated at byte 16");
  EXPECT_STREQ(e.what(), "/data/train-images.idx: truncated at byte 16");
  EXPECT_EQ(e.file(), "/data/train-images.idx");
}

TEST(Error, EveryKindIsADdpErrorAndARuntimeError) {
  static_assert(std::is_base_of_v<std::runtime_error, Error>);
  static_assert(std::is_base_of_v<Error, ConfigError>);
  static_assert(std::is_base_of_v<Error, StoreError>);
  static_assert(std::is_base_of_v<StoreError, JoinRefusedError>);
  static_assert(std::is_base_of_v<Error, CommError>);
  static_assert(std::is_base_of_v<CommError, TimeoutError>);
  static_assert(std::is_base_of_v<Error, DataError>);
  try {
    throw JoinRefusedError("the job's join token is wrong");
  } catch (const StoreError& e) {
    EXPECT_STREQ(e.what(), "the job's join token is wrong");
  }
  try {
    throw DataError("ckpt.pt", "bad magic");
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "ckpt.pt: bad magic");
  }
}

}  // namespace
}  // namespace ddp
