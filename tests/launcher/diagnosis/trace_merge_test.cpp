#include "diagnosis/trace_merge.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include <gtest/gtest.h>

#include "ddp/error.h"

namespace ddprun {
namespace {

std::string trace_of(int rank, const char* name) {
  return nlohmann::json{
      {"traceEvents", {{{"name", name}, {"ph", "X"}, {"pid", rank}, {"ts", 1}, {"dur", 2}}}}}
      .dump();
}

TEST(TraceMerge, OneTraceHoldsEveryRanksEvents) {
  const auto merged = nlohmann::json::parse(
      merge_traces({{0, trace_of(0, "forward")}, {1, trace_of(1, "backward")}}));
  ASSERT_EQ(merged["traceEvents"].size(), 2u);
  EXPECT_EQ(merged["traceEvents"][0]["pid"], 0);
  EXPECT_EQ(merged["traceEvents"][1]["name"], "backward");
  EXPECT_EQ(merged["displayTimeUnit"], "ms");
}

TEST(TraceMerge, AFileThatIsNoTraceIsNamedByItsRank) {
  try {
    merge_traces({{0, trace_of(0, "forward")}, {3, "{\"events\": []}"}});
    FAIL() << "expected an error";
  } catch (const ddp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 3's trace is not a Chrome trace"), std::string::npos)
        << e.what();
  }
}

TEST(TraceMerge, ReadsOnlyTheRanksTraceFiles) {
  char pattern[] = "/tmp/ddprun-trace-XXXXXX";
  const std::string dir = mkdtemp(pattern);
  std::ofstream(dir + "/trace-rank1.json") << trace_of(1, "b");
  std::ofstream(dir + "/trace-rank0.json") << trace_of(0, "a");
  std::ofstream(dir + "/trace.json") << "{}";
  std::ofstream(dir + "/trace-rank2.json.tmp") << "{}";
  const auto traces = read_local_traces(dir);
  ASSERT_EQ(traces.size(), 2u);
  EXPECT_EQ(traces[0].first, 0);
  EXPECT_EQ(traces[1].first, 1);
  EXPECT_TRUE(read_local_traces(dir + "/missing").empty());
  EXPECT_TRUE(read_local_traces("").empty());
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace ddprun
