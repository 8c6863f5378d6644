// The live metrics file: what a writer records, a reader in another process sees whole.
#include "ddp/live_metrics.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "ddp/error.h"

namespace ddp::live {
namespace {

std::string temp_path(const char* name) {
  return (std::filesystem::temp_directory_path() /
          (std::string(name) + "-" + std::to_string(::getpid())))
      .string();
}

TEST(LiveMetrics, AReaderSeesWhatTheWriterRecorded) {
  const std::string path = temp_path("live-metrics");
  {
    Writer w(path, 3, 8);
    auto s = read(path);
    ASSERT_TRUE(s);
    EXPECT_EQ(s->rank, 3);
    EXPECT_EQ(s->world_size, 8);
    EXPECT_EQ(s->pid, ::getpid());
    EXPECT_EQ(s->steps, 0u);
    EXPECT_EQ(s->step, -1);  // no progress record yet

    w.add_step(0.25, 64, 0.05, 1000);
    w.add_step(0.5, 32, 0.0, 1000);
    w.set_progress(2, 1, 0.6931, 0.05, 384.5, 0.375);
    w.set_straggler_ratio(1.25);
    s = read(path);
    ASSERT_TRUE(s);
    EXPECT_EQ(s->steps, 2u);
    EXPECT_EQ(s->images, 96u);
    EXPECT_DOUBLE_EQ(s->step_seconds_total, 0.75);
    EXPECT_DOUBLE_EQ(s->allreduce_wait_seconds_total, 0.05);
    EXPECT_DOUBLE_EQ(s->allreduce_bytes_total, 2000);
    EXPECT_EQ(s->step, 2);
    EXPECT_EQ(s->epoch, 1);
    EXPECT_DOUBLE_EQ(s->loss, 0.6931);
    EXPECT_DOUBLE_EQ(s->learning_rate, 0.05);
    EXPECT_DOUBLE_EQ(s->images_per_second, 384.5);
    EXPECT_DOUBLE_EQ(s->step_seconds, 0.375);
    EXPECT_DOUBLE_EQ(s->straggler_ratio, 1.25);
  }
  // The file outlives its writer: the agent still reads a finished worker's last figures.
  auto s = read(path);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->steps, 2u);
  std::filesystem::remove(path);
}

TEST(LiveMetrics, NotABlockReadsAsNothing) {
  EXPECT_FALSE(read("/nonexistent/live_metrics.bin"));
  const std::string path = temp_path("live-metrics-garbage");
  {
    std::ofstream out(path);
    out << std::string(4096, 'x');
  }
  EXPECT_FALSE(read(path));
  { std::ofstream out(path, std::ios::trunc); }
  EXPECT_FALSE(read(path));  // empty: a writer that has not mapped it yet
  std::filesystem::remove(path);
}

TEST(LiveMetrics, AFileThatCannotBeCreatedIsADataErrorNamingIt) {
  try {
    Writer w("/nonexistent-dir/live_metrics.bin", 0, 1);
    FAIL() << "expected a DataError";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent-dir/live_metrics.bin"), std::string::npos)
        << e.what();
  }
}

TEST(LiveMetrics, WithoutTheVariableAWriterRecordsNothing) {
  ::unsetenv("DDP_LIVE_METRICS_FILE");
  Writer w = Writer::from_environment(0, 1);
  EXPECT_FALSE(w.enabled());
  w.add_step(1, 1, 1, 1);  // a no-op, not a crash
}

// A reader in another process never sees a torn record: every pair (step, loss) it reads is one
// the writer wrote together, here loss == step / 2 and images == 2 * steps.
TEST(LiveMetrics, AReaderInAnotherProcessNeverSeesATornRecord) {
  const std::string path = temp_path("live-metrics-torn");
  Writer w(path, 0, 1);
  const pid_t reader = ::fork();
  ASSERT_GE(reader, 0);
  if (reader == 0) {
    int bad = 0;
    int seen = 0;
    for (int i = 0; i < 200000 && seen < 20000; ++i) {
      const auto s = read(path);
      if (!s || s->step < 0) continue;
      ++seen;
      if (s->loss != static_cast<double>(s->step) / 2 || s->images != 2 * s->steps) ++bad;
    }
    std::_Exit(bad == 0 && seen > 0 ? 0 : 1);
  }
  for (std::int64_t i = 1; i <= 2000000; ++i) {
    w.add_step(0.001, 2, 0, 0);
    w.set_progress(static_cast<std::int64_t>(i), 0, static_cast<double>(i) / 2, 0, 0, 0);
    if (i % 1024 == 0) {
      int status = 0;
      if (::waitpid(reader, &status, WNOHANG) == reader) {
        EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "a torn read";
        std::filesystem::remove(path);
        return;
      }
    }
  }
  int status = 0;
  ::waitpid(reader, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "a torn read";
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace ddp::live
