#include "ddp/flight_recorder.h"

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "ddp/error.h"

namespace ddp::flight {
namespace {

using std::chrono::milliseconds;

struct TempDir {
  std::string path;
  TempDir() {
    char p[] = "/tmp/ddp-flight-XXXXXX";
    path = mkdtemp(p);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
};

Recorder::Op allreduce_op(std::uint64_t count, OpLabel::Current label = {}) {
  return {OpKind::kAllreduce, name_code("float32"), count, count * 4, label};
}

TEST(FlightRecorder, RecordsOpsInOrderWithTheirFields) {
  Recorder r(8, "", 2, 4);
  ASSERT_TRUE(r.enabled());
  const auto s1 = r.begin(allreduce_op(1024));
  Recorder::note_algorithm(name_code("ring"));
  Recorder::note_algorithm(name_code("direct"));  // the first note stands
  r.end(s1, true);
  {
    const OpLabel label("bucket", 3);
    const auto s2 = r.begin(allreduce_op(256, OpLabel::current()));
    Recorder::note_waiting_on(1);
    const Snapshot running = r.snapshot();
    ASSERT_NE(running.running(), nullptr);
    EXPECT_EQ(running.running()->seq, s2);
    EXPECT_EQ(running.running()->waiting_on, 1);
    EXPECT_EQ(running.running()->describe(), "allreduce #2 (bucket 3, 1.0 KiB float32)");
    r.end(s2, false);
  }
  EXPECT_EQ(OpLabel::current().name, 0U);  // the label ended with its scope
  const Snapshot s = r.snapshot();
  EXPECT_EQ(s.rank, 2);
  EXPECT_EQ(s.world_size, 4);
  EXPECT_EQ(s.pid, getpid());
  EXPECT_EQ(s.begun, 2U);
  ASSERT_EQ(s.ops.size(), 2U);
  EXPECT_EQ(s.ops[0].seq, 1U);
  EXPECT_EQ(s.ops[0].state, OpState::kDone);
  EXPECT_EQ(s.ops[0].algorithm, "ring");
  EXPECT_EQ(s.ops[0].describe(), "allreduce #1 (4.0 KiB float32, ring)");
  EXPECT_GE(s.ops[0].end_ns, s.ops[0].start_ns);
  EXPECT_EQ(s.ops[1].state, OpState::kFailed);
  EXPECT_EQ(s.ops[1].waiting_on, -1);  // cleared at the end
  EXPECT_EQ(s.running(), nullptr);
  EXPECT_EQ(s.last_finished()->seq, 2U);
}

TEST(FlightRecorder, KeepsTheLastCapacityOps) {
  Recorder r(4, "", 0, 1);
  for (int i = 0; i < 11; ++i) r.end(r.begin(allreduce_op(1)), true);
  const Snapshot s = r.snapshot();
  ASSERT_EQ(s.ops.size(), 4U);
  EXPECT_EQ(s.ops.front().seq, 8U);
  EXPECT_EQ(s.ops.back().seq, 11U);
  EXPECT_EQ(s.begun, 11U);
}

TEST(FlightRecorder, ZeroCapacityRecordsNothing) {
  Recorder r(0, "", 0, 1);
  EXPECT_FALSE(r.enabled());
  EXPECT_EQ(r.begin(allreduce_op(1)), 0U);
  Recorder::note_waiting_on(3);  // no running op: nothing to note, no crash
  r.end(0, true);
  EXPECT_TRUE(r.snapshot().ops.empty());
}

TEST(FlightRecorder, BarrierAndBytesDescribeThemselves) {
  Recorder r(4, "", 0, 2);
  r.end(r.begin({OpKind::kBarrier, 0, 0, 0, {}}), true);
  r.end(r.begin({OpKind::kBroadcast, name_code("int64"), 3 << 20, 24 << 20, {}}), true);
  r.end(r.begin({OpKind::kAllgather, name_code("uint8"), 100, 100, {}}), true);
  const auto ops = r.snapshot().ops;
  EXPECT_EQ(ops[0].describe(), "barrier #1");
  EXPECT_EQ(ops[1].describe(), "broadcast #2 (24.0 MiB int64)");
  EXPECT_EQ(ops[2].describe(), "allgather #3 (100 B uint8)");
}

TEST(FlightRecorder, NamesKeepTheirFirstEightCharacters) {
  static_assert(name_code("ring") == 0x676e6972ULL, "little-endian bytes, as memcpy would");
  static_assert(name_code("") == 0 && name_code(nullptr) == 0);
  Recorder r(2, "", 0, 2);
  const OpLabel label("parameters", 7);
  const auto seq = r.begin(allreduce_op(1, OpLabel::current()));
  Recorder::note_algorithm(name_code("recursive_doubling"));
  r.end(seq, true);
  EXPECT_EQ(r.snapshot().ops[0].describe(), "allreduce #1 (paramete 7, 4 B float32, recursiv)");
}

TEST(FlightRecorder, ThresholdIsTheWarningButAtMostThreeQuartersOfTheTimeout) {
  Snapshot s;
  s.warn_after = milliseconds(60000);
  s.timeout = milliseconds(1800000);
  EXPECT_EQ(s.warn_threshold(), milliseconds(60000));
  s.timeout = milliseconds(20000);
  EXPECT_EQ(s.warn_threshold(), milliseconds(15000));
  s.warn_after = milliseconds(0);
  EXPECT_EQ(s.warn_threshold(), milliseconds(0));
}

// The agent's view: another process reads the file while the writer runs, and after it died.
TEST(FlightRecorder, AnotherProcessReadsTheFileLiveAndAfterTheWriterExits) {
  TempDir dir;
  const std::string path = dir.path + "/ring.bin";
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t writer = fork();
  ASSERT_GE(writer, 0);
  if (writer == 0) {
    Recorder r(16, path, 5, 8);
    r.set_thresholds(milliseconds(3000), milliseconds(20000));
    for (int i = 0; i < 20; ++i) r.end(r.begin(allreduce_op(i + 1)), true);
    r.begin(allreduce_op(99));  // left running
    Recorder::note_waiting_on(4);
    (void)!write(ready[1], "x", 1);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    _exit(0);
  }
  char c;
  ASSERT_EQ(read(ready[0], &c, 1), 1);
  std::string error;
  const auto live = read_file(path, &error);
  ASSERT_TRUE(live) << error;
  EXPECT_EQ(live->pid, writer);
  EXPECT_EQ(live->rank, 5);
  EXPECT_EQ(live->warn_threshold(), milliseconds(3000));
  EXPECT_EQ(live->ops.size(), 16U);
  ASSERT_NE(live->running(), nullptr);
  EXPECT_EQ(live->running()->seq, 21U);
  EXPECT_EQ(live->running()->count, 99U);
  EXPECT_EQ(live->running()->waiting_on, 4);
  EXPECT_EQ(live->last_finished()->seq, 20U);
  int status = 0;
  ASSERT_EQ(waitpid(writer, &status, 0), writer);
  const auto after = read_file(path, &error);
  ASSERT_TRUE(after) << error;
  EXPECT_EQ(after->running()->seq, 21U);  // what it was in when it died
  close(ready[0]);
  close(ready[1]);
}

// Readers never see a torn entry: every op read whole has the count its seq was written with.
TEST(FlightRecorder, ConcurrentReadsSeeOnlyWholeEntries) {
  TempDir dir;
  const std::string path = dir.path + "/ring.bin";
  Recorder r(8, path, 0, 2);
  std::atomic<bool> stop{false};
  std::thread writer([&] {
    while (!stop) r.end(r.begin(allreduce_op(r.snapshot().begun + 1)), true);
  });
  int reads = 0;
  std::string wrong;
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(300);
  while (wrong.empty() && std::chrono::steady_clock::now() < until) {
    const auto s = read_file(path);
    if (!s) wrong = "unreadable";
    for (const auto& op : s ? s->ops : std::vector<OpRecord>{}) {
      if (op.count != op.seq) wrong = "torn entry: " + op.describe();
    }
    ++reads;
  }
  stop = true;
  writer.join();
  EXPECT_EQ(wrong, "");
  EXPECT_GT(reads, 10);
}

TEST(FlightRecorder, ReadFileNamesWhatIsWrong) {
  TempDir dir;
  std::string error;
  EXPECT_FALSE(read_file(dir.path + "/missing.bin", &error));
  EXPECT_NE(error.find("missing.bin: No such file"), std::string::npos) << error;
  const std::string junk = dir.path + "/junk.bin";
  std::ofstream(junk) << std::string(4096, 'x');
  EXPECT_FALSE(read_file(junk, &error));
  EXPECT_NE(error.find("not a flight recorder"), std::string::npos) << error;
  std::ofstream(dir.path + "/short.bin") << "x";
  EXPECT_FALSE(read_file(dir.path + "/short.bin", &error));
  EXPECT_NE(error.find("too short"), std::string::npos) << error;
}

TEST(FlightRecorder, AnUncreatableFileIsAConfigErrorNamingIt) {
  try {
    Recorder r(4, "/nonexistent-dir/ring.bin", 0, 1);
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent-dir/ring.bin"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace ddp::flight
