// The one rank-aware logger (lib/src/log.cpp): its level from DDP_LOG_LEVEL, read once when the
// logger is first used, and the rank in every line once set_rank() was called. Each case runs in
// a child process of its own (the logger is a process-wide singleton) with stderr sent to a file.
#include "ddp/log.h"

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>

#include <gtest/gtest.h>

#include "multiprocess.h"

namespace ddp {
namespace {

// Runs body in a child whose stderr goes to a file, with DDP_LOG_LEVEL as given (unset if empty),
// and returns what the child wrote.
std::string stderr_of(const std::string& level, const std::function<void()>& body) {
  const auto path = std::filesystem::temp_directory_path() /
                    ("ddp_log_test_" + std::to_string(::getpid()) + ".txt");
  const auto outcomes = testing::run_ranks(1, std::chrono::seconds(30), [&](int) {
    if (level.empty()) {
      ::unsetenv("DDP_LOG_LEVEL");
    } else {
      ::setenv("DDP_LOG_LEVEL", level.c_str(), 1);
    }
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0 || ::dup2(fd, STDERR_FILENO) < 0) throw std::runtime_error("cannot redirect stderr");
    body();
    log::logger().flush();
    std::fflush(stderr);
  });
  EXPECT_TRUE(testing::all_ranks_succeeded(outcomes));
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::filesystem::remove(path);
  return text;
}

void log_every_level() {
  log::debug("a debug line");
  log::info("an info line");
  log::warn("a warn line");
  log::error("an error line");
}

TEST(Log, DefaultsToInfo) {
  const std::string out = stderr_of("", log_every_level);
  EXPECT_EQ(out.find("a debug line"), std::string::npos) << out;
  EXPECT_NE(out.find("[ddp] [info] an info line"), std::string::npos) << out;
  EXPECT_NE(out.find("[ddp] [warning] a warn line"), std::string::npos) << out;
  EXPECT_NE(out.find("[ddp] [error] an error line"), std::string::npos) << out;
}

TEST(Log, LevelComesFromTheSetting) {
  const std::string warn = stderr_of("warn", log_every_level);
  EXPECT_EQ(warn.find("an info line"), std::string::npos) << warn;
  EXPECT_NE(warn.find("a warn line"), std::string::npos) << warn;
  const std::string debug = stderr_of("debug", log_every_level);
  EXPECT_NE(debug.find("[debug] a debug line"), std::string::npos) << debug;
  EXPECT_EQ(stderr_of("off", log_every_level), "");
}

TEST(Log, AMalformedLevelFallsBackToInfoWithoutThrowing) {
  // settings::validate_all() reports it at the program's start; the logger must still work.
  const std::string out = stderr_of("chatty", log_every_level);
  EXPECT_EQ(out.find("a debug line"), std::string::npos) << out;
  EXPECT_NE(out.find("an info line"), std::string::npos) << out;
}

TEST(Log, EveryLineAfterSetRankCarriesTheRank) {
  const std::string out = stderr_of("", [] {
    log::info("before the rank is known");
    log::set_rank(3);
    log::info("after the rank is known");
    log::warn("a warning with the rank");
  });
  EXPECT_NE(out.find("[ddp] [info] before the rank is known"), std::string::npos) << out;
  EXPECT_NE(out.find("[rank3] [info] after the rank is known"), std::string::npos) << out;
  EXPECT_NE(out.find("[rank3] [warning] a warning with the rank"), std::string::npos) << out;
  EXPECT_EQ(out.find("[ddp] [info] after"), std::string::npos) << out;
}

}  // namespace
}  // namespace ddp
