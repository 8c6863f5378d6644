// Unit test of lib/src/train/metrics_log.cpp: MetricsLog writes one JSON object per event, with
// the event name, a Unix time and each field in its JSON type, flushed at once and appended to
// what the file held; a disabled log writes nothing; an unopenable path is a DataError.
#include "ddp/train/metrics_log.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ddp/error.h"

namespace ddp::train {
namespace {

namespace fs = std::filesystem;

// A fresh directory, removed with everything in it at the end of the test.
class MetricsLogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "metrics_log_test.XXXXXX").string();
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override {
    std::error_code ignored;
    fs::remove_all(dir_, ignored);
  }

  std::vector<std::string> lines_of(const fs::path& path) const {
    std::ifstream in(path);
    std::vector<std::string> lines;
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    return lines;
  }

  fs::path dir_;
};

TEST_F(MetricsLogTest, ADefaultLogIsDisabledAndWritesNothing) {
  MetricsLog log;
  EXPECT_FALSE(log.enabled());
  log.write("step", {{"loss", 1.0}});  // no file, no error
  EXPECT_TRUE(fs::is_empty(dir_));
}

TEST_F(MetricsLogTest, EachEventIsOneJsonObjectWithTypedFields) {
  const fs::path path = dir_ / "metrics.jsonl";
  MetricsLog log(path.string());
  EXPECT_TRUE(log.enabled());
  log.write("step", {{"step", int64_t{7}},
                     {"loss", 0.5},
                     {"synced", true},
                     {"phase", std::string("train")},
                     {"lrs", std::vector<double>{0.1, 0.25}}});
  log.write("epoch_end", {});

  const auto lines = lines_of(path);
  ASSERT_EQ(lines.size(), 2u);
  const auto step = nlohmann::json::parse(lines[0]);
  EXPECT_EQ(step.size(), 7u) << lines[0];
  EXPECT_EQ(step.at("event"), "step");
  ASSERT_TRUE(step.at("step").is_number_integer());
  EXPECT_EQ(step.at("step").get<int64_t>(), 7);
  ASSERT_TRUE(step.at("loss").is_number_float());
  EXPECT_EQ(step.at("loss").get<double>(), 0.5);
  ASSERT_TRUE(step.at("synced").is_boolean());
  EXPECT_TRUE(step.at("synced").get<bool>());
  EXPECT_EQ(step.at("phase"), "train");
  EXPECT_EQ(step.at("lrs"), nlohmann::json::array({0.1, 0.25}));
  ASSERT_TRUE(step.at("time").is_number_float());

  const auto end = nlohmann::json::parse(lines[1]);
  EXPECT_EQ(end, (nlohmann::json{{"event", "epoch_end"}, {"time", end.at("time")}}));
}

TEST_F(MetricsLogTest, TheTimeIsSecondsSinceTheUnixEpoch) {
  const fs::path path = dir_ / "metrics.jsonl";
  {
    MetricsLog log(path.string());
    log.write("tick", {});
  }
  const auto lines = lines_of(path);
  ASSERT_EQ(lines.size(), 1u);
  const double time = nlohmann::json::parse(lines[0]).at("time").get<double>();
  // The same clock as time(2), in seconds (not milliseconds): within a minute of it.
  const auto now = static_cast<double>(std::time(nullptr));
  EXPECT_NEAR(time, now, 60.0);
  EXPECT_NEAR(unix_time(), now, 60.0);
}

TEST_F(MetricsLogTest, EveryLineIsOnDiskAsSoonAsItIsWritten) {
  const fs::path path = dir_ / "metrics.jsonl";
  MetricsLog log(path.string());
  log.write("step", {{"step", int64_t{1}}});
  EXPECT_EQ(lines_of(path).size(), 1u) << "the line was not flushed";
  log.write("step", {{"step", int64_t{2}}});
  const auto lines = lines_of(path);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(nlohmann::json::parse(lines[1]).at("step"), 2);
}

TEST_F(MetricsLogTest, ANewLogAppendsToTheFile) {
  const fs::path path = dir_ / "metrics.jsonl";
  { std::ofstream(path) << "{\"event\":\"earlier\"}\n"; }
  {
    MetricsLog log(path.string());
    log.write("first", {});
  }
  {
    MetricsLog log(path.string());
    log.write("second", {});
  }
  const auto lines = lines_of(path);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(nlohmann::json::parse(lines[0]).at("event"), "earlier");
  EXPECT_EQ(nlohmann::json::parse(lines[1]).at("event"), "first");
  EXPECT_EQ(nlohmann::json::parse(lines[2]).at("event"), "second");
}

TEST_F(MetricsLogTest, StringsWithQuotesAndNewlinesStayOnOneLine) {
  const fs::path path = dir_ / "metrics.jsonl";
  MetricsLog log(path.string());
  const std::string note = "line one\nsaid \"hi\"\t\\ done";
  log.write("note", {{"text", note}});
  const auto lines = lines_of(path);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(nlohmann::json::parse(lines[0]).at("text"), note);
}

TEST_F(MetricsLogTest, NonFiniteNumbersKeepTheLineValidJson) {
  const fs::path path = dir_ / "metrics.jsonl";
  MetricsLog log(path.string());
  log.write("step", {{"loss", std::numeric_limits<double>::quiet_NaN()},
                     {"grad_norm", std::numeric_limits<double>::infinity()}});
  const auto lines = lines_of(path);
  ASSERT_EQ(lines.size(), 1u);
  nlohmann::json parsed;
  ASSERT_NO_THROW(parsed = nlohmann::json::parse(lines[0])) << lines[0];
  EXPECT_TRUE(parsed.at("loss").is_null());
  EXPECT_TRUE(parsed.at("grad_norm").is_null());
}

TEST_F(MetricsLogTest, AnUnopenablePathIsADataErrorNamingIt) {
  const std::string path = (dir_ / "no-such-dir" / "metrics.jsonl").string();
  try {
    MetricsLog log(path);
    FAIL() << "no error for " << path;
  } catch (const DataError& e) {
    EXPECT_EQ(e.file(), path);
    EXPECT_EQ(std::string(e.what()).rfind(path + ": cannot open metrics file: ", 0), 0u)
        << e.what();
  }
  EXPECT_FALSE(fs::exists(dir_ / "no-such-dir"));
}

}  // namespace
}  // namespace ddp::train
