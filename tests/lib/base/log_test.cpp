// The one rank-aware logger (lib/src/base/log.cpp): its level from DDP_LOG_LEVEL, read once when the
// logger is first used, and the rank in every line once set_rank() was called. The logger is a
// process-wide singleton, so each case runs this program again (a fresh process, whatever this
// one logged before) with stderr sent to a file.
#include "ddp/log.h"

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>

#include <gtest/gtest.h>

#include "multiprocess.h"

namespace ddp {
namespace {

// Runs the disabled case `child_case` of this program in a fresh process whose stderr goes to a
// file, with DDP_LOG_LEVEL as given (unset if empty), and returns what it wrote there.
std::string stderr_of(const std::string& level, const std::string& child_case) {
  const auto path = std::filesystem::temp_directory_path() /
                    ("ddp_log_test_" + std::to_string(::getpid()) + ".txt");
  const std::string filter = "--gtest_filter=Log.DISABLED_" + child_case;
  const auto outcomes = testing::run_ranks(1, std::chrono::seconds(30), [&](int) {
    if (level.empty()) {
      ::unsetenv("DDP_LOG_LEVEL");
    } else {
      ::setenv("DDP_LOG_LEVEL", level.c_str(), 1);
    }
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0 || ::dup2(fd, STDERR_FILENO) < 0) throw std::runtime_error("cannot redirect stderr");
    ::execl("/proc/self/exe", "base_unit_tests", "--gtest_also_run_disabled_tests", filter.c_str(),
            static_cast<char*>(nullptr));
    throw std::runtime_error("cannot run this test program again");
  });
  EXPECT_TRUE(testing::all_ranks_succeeded(outcomes));
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::filesystem::remove(path);
  return text;
}

// Run only by the cases below, in a process of their own.
TEST(Log, DISABLED_EveryLevel) {
  log::debug("a debug line");
  log::info("an info line");
  log::warn("a warn line");
  log::error("an error line");
  log::logger().flush();
}

TEST(Log, DISABLED_SetRank) {
  log::info("before the rank is known");
  log::set_rank(3);
  log::info("after the rank is known");
  log::warn("a warning with the rank");
  log::logger().flush();
}

TEST(Log, DefaultsToInfo) {
  const std::string out = stderr_of("", "EveryLevel");
  EXPECT_EQ(out.find("a debug line"), std::string::npos) << out;
  EXPECT_NE(out.find("[ddp] [info] an info line"), std::string::npos) << out;
  EXPECT_NE(out.find("[ddp] [warning] a warn line"), std::string::npos) << out;
  EXPECT_NE(out.find("[ddp] [error] an error line"), std::string::npos) << out;
}

TEST(Log, LevelComesFromTheSetting) {
  const std::string warn = stderr_of("warn", "EveryLevel");
  EXPECT_EQ(warn.find("an info line"), std::string::npos) << warn;
  EXPECT_NE(warn.find("a warn line"), std::string::npos) << warn;
  const std::string debug = stderr_of("debug", "EveryLevel");
  EXPECT_NE(debug.find("[debug] a debug line"), std::string::npos) << debug;
  EXPECT_EQ(stderr_of("off", "EveryLevel"), "");
}

TEST(Log, AMalformedLevelFallsBackToInfoWithoutThrowing) {
  // settings::validate_all() reports it at the program's start; the logger must still work.
  const std::string out = stderr_of("chatty", "EveryLevel");
  EXPECT_EQ(out.find("a debug line"), std::string::npos) << out;
  EXPECT_NE(out.find("an info line"), std::string::npos) << out;
}

TEST(Log, EveryLineAfterSetRankCarriesTheRank) {
  const std::string out = stderr_of("", "SetRank");
  EXPECT_NE(out.find("[ddp] [info] before the rank is known"), std::string::npos) << out;
  EXPECT_NE(out.find("[rank3] [info] after the rank is known"), std::string::npos) << out;
  EXPECT_NE(out.find("[rank3] [warning] a warning with the rank"), std::string::npos) << out;
  EXPECT_EQ(out.find("[ddp] [info] after"), std::string::npos) << out;
}

}  // namespace
}  // namespace ddp
