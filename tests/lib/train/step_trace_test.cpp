#include "train/step_trace.h"

#include <nlohmann/json.hpp>

#include <gtest/gtest.h>

#include "ddp/error.h"

namespace ddp::train::detail {
namespace {

using Clock = StepTrace::Clock;
using std::chrono::milliseconds;

TEST(StepTrace, ParsesStepRanges) {
  EXPECT_EQ(parse_step_range("3:7").first, 3);
  EXPECT_EQ(parse_step_range("3:7").last, 7);
  EXPECT_EQ(parse_step_range("5").last, 5);
  for (const char* bad : {"0:3", "4:2", "a:b", "3:", ":3", "3:4x", ""}) {
    EXPECT_THROW(parse_step_range(bad), ConfigError) << bad;
  }
}

TEST(StepTrace, TracesOnlyItsStepsAsChromeTraceEvents) {
  StepTrace trace(StepRange{2, 3}, "", 1, 0);
  const auto t0 = Clock::now();
  trace.span("forward", t0, t0 + milliseconds(5), 1);  // not traced
  trace.span("forward", t0, t0 + milliseconds(5), 2);
  trace.span("backward", t0 + milliseconds(5), t0 + milliseconds(15), 2);

  flight::Recorder recorder(8, "", 1, 2);
  recorder.set_precise_stamps(true);
  const auto before = recorder.snapshot().begun;
  {
    const flight::OpLabel label("bucket", 0);
    recorder.end(recorder.begin({flight::OpKind::kAllreduce, flight::name_code("float32"), 256,
                                 1024, flight::OpLabel::current()}),
                 true);
  }
  trace.add_collectives(recorder.snapshot(), before, 2);

  const auto doc = nlohmann::json::parse(trace.json());
  std::vector<std::string> names;
  for (const auto& e : doc["traceEvents"]) {
    if (e["ph"] == "M") continue;
    names.push_back(e["name"]);
    EXPECT_EQ(e["pid"], 1);
    EXPECT_EQ(e["args"]["step"], 2);
    EXPECT_GT(e["ts"].get<double>(), 1.7e15) << "wall-clock microseconds";
  }
  EXPECT_EQ(names, (std::vector<std::string>{"forward", "backward", "allreduce bucket 0"}));
  const auto& forward = doc["traceEvents"][4];
  EXPECT_NEAR(forward["dur"].get<double>(), 5000, 1);
  const auto& collective = doc["traceEvents"][6];
  EXPECT_EQ(collective["tid"], 1);
  EXPECT_EQ(collective["args"]["op"], "allreduce #1 (bucket 0, 1.0 KiB float32)");
  EXPECT_EQ(doc["traceEvents"][0]["args"]["name"], "rank 1 (node 0)");
}

TEST(StepTrace, AnUnwritableFileIsADataError) {
  StepTrace trace(StepRange{1, 1}, "/nonexistent-dir/trace-rank0.json", 0, -1);
  trace.span("forward", Clock::now(), Clock::now(), 1);
  EXPECT_THROW(trace.write_after(1), DataError);
}

}  // namespace
}  // namespace ddp::train::detail
