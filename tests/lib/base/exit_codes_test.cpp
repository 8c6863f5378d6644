// Unit test of lib/src/base/exit_codes.cpp: the exit codes keep their sysexits(3) values, and
// for_exception maps each ddp::Error subclass (subclasses of subclasses included) to its code and
// everything else to kFailure.
#include "ddp/exit_codes.h"

#include <sysexits.h>

#include <gtest/gtest.h>

#include <new>
#include <stdexcept>

#include "ddp/error.h"

namespace ddp {
namespace {

TEST(ExitCodes, KeepTheirSysexitsValues) {
  EXPECT_EQ(exit_code::kSuccess, 0);
  EXPECT_EQ(exit_code::kFailure, 1);
  EXPECT_EQ(exit_code::kConfig, EX_USAGE);
  EXPECT_EQ(exit_code::kData, EX_DATAERR);
  EXPECT_EQ(exit_code::kRendezvous, EX_UNAVAILABLE);
  EXPECT_EQ(exit_code::kComm, EX_SOFTWARE);
  EXPECT_EQ(exit_code::kPreempted, EX_TEMPFAIL);
  EXPECT_EQ(exit_code::kSignalBase, 128);
}

TEST(ExitCodes, EachErrorKindMapsToItsCode) {
  EXPECT_EQ(exit_code::for_exception(ConfigError("bad flag")), 64);
  EXPECT_EQ(exit_code::for_exception(DataError("train.idx", "truncated")), 65);
  EXPECT_EQ(exit_code::for_exception(StoreError("no store")), 69);
  EXPECT_EQ(exit_code::for_exception(CommError("allreduce", 0, 1, "peer died")), 70);
}

TEST(ExitCodes, SubclassesMapLikeTheirBase) {
  EXPECT_EQ(exit_code::for_exception(JoinRefusedError("wrong token")), exit_code::kRendezvous);
  EXPECT_EQ(exit_code::for_exception(TimeoutError("barrier", 2, -1, "30 s")), exit_code::kComm);
}

TEST(ExitCodes, AnythingElseIsAPlainFailure) {
  EXPECT_EQ(exit_code::for_exception(Error("some ddp error")), exit_code::kFailure);
  EXPECT_EQ(exit_code::for_exception(std::runtime_error("boom")), exit_code::kFailure);
  EXPECT_EQ(exit_code::for_exception(std::bad_alloc()), exit_code::kFailure);
  EXPECT_EQ(exit_code::for_exception(std::logic_error("bug")), exit_code::kFailure);
}

TEST(ExitCodes, TheDynamicTypeDecidesNotTheStaticOne) {
  const ConfigError config("bad flag");
  const std::exception& as_base = config;
  EXPECT_EQ(exit_code::for_exception(as_base), exit_code::kConfig);
}

}  // namespace
}  // namespace ddp
