// A worker stream's route and console form, as torchrun 2.6 gives them: the tee'd prefix and
// TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE, bare streams as written, the log file and the tail.
#include "supervision/worker_output.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "ddp/error.h"

namespace ddprun {
namespace {

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void put(WorkerOutput& out, const std::string& bytes) { out.write(bytes.data(), bytes.size()); }

// A file standing in for the console.
class CapturedFd {
 public:
  CapturedFd() {
    char p[] = "/tmp/ddprun-unit-XXXXXX";
    fd_ = mkstemp(p);
    path_ = p;
  }
  ~CapturedFd() {
    close(fd_);
    unlink(path_.c_str());
  }
  int fd() const { return fd_; }
  std::string path() const { return path_; }
  std::string text() const { return slurp(path_); }

 private:
  int fd_;
  std::string path_;
};

TEST(WorkerLinePrefix, TheDefaultIsTorchrunsTeeHeaderOfRoleAndLocalRank) {
  // tail_log.py: f"[{name}{local_rank}]:" with the role as the name; no space after the colon.
  EXPECT_EQ(worker_line_prefix(std::nullopt, "default", 5, 0), "[default0]:");
  EXPECT_EQ(worker_line_prefix(std::nullopt, "trainer", 5, 1), "[trainer1]:");
  EXPECT_EQ(worker_line_prefix(std::nullopt, "my-role_2", 7, 3), "[my-role_23]:");
  // An empty template is unset, as in torchrun (`if self._log_line_prefix_template:`).
  EXPECT_EQ(worker_line_prefix(std::string(), "trainer", 5, 1), "[trainer1]:");
}

TEST(WorkerLinePrefix, TheTemplateIsFilledInAsSafeSubstituteFillsIt) {
  // Python's string.Template(t).safe_substitute(role_name=, rank=global, local_rank=).
  const auto prefix = [](const std::string& t) { return worker_line_prefix(t, "trainer", 5, 1); };
  EXPECT_EQ(prefix("[${role_name}${local_rank}]:"), "[trainer1]:");  // torchrun's own header
  EXPECT_EQ(prefix("[rank${rank}]:"), "[rank5]:");                   // ddprun's old prefix
  EXPECT_EQ(prefix("${role_name}|${rank}|${local_rank}"), "trainer|5|1");
  EXPECT_EQ(prefix("$role_name/$rank/$local_rank| "), "trainer/5/1| ");
  EXPECT_EQ(prefix("${rank}0 $$rank $$"), "50 $rank $");
  EXPECT_EQ(worker_line_prefix("<${role_name}>", "worker-a", 0, 0), "<worker-a>");
  // Unknown names (longer ones too), other case, unclosed or spaced braces, "$" before a
  // non-name and a trailing "$" stay as written.
  EXPECT_EQ(prefix("$ranks $rank0 ${host} $RANK ${Rank} ${rank $ $1 ${ rank} end$"),
            "$ranks $rank0 ${host} $RANK ${Rank} ${rank $ $1 ${ rank} end$");
  EXPECT_EQ(prefix("[$host:${rank}]"), "[$host:5]");
}

TEST(StreamRoute, FollowsTorchrunsLogsSpecs) {
  using Console = StreamRoute::Console;
  struct Case {
    bool redirected, teed, shown;
    Console console;
    bool to_file, filtered;
  };
  for (const Case& c : {
           Case{false, false, true, Console::kAsWritten, false, false},  // inherits the console
           Case{true, false, true, Console::kNone, true, false},         // --redirects: file only
           Case{false, true, true, Console::kPrefixed, true, true},      // --tee
           Case{true, true, true, Console::kPrefixed, true, true},
           // --local-ranks-filter hides: tee'd streams to the file only, others to /dev/null.
           Case{false, false, false, Console::kNone, false, false},
           Case{true, false, false, Console::kNone, true, false},
           Case{false, true, false, Console::kNone, true, false},
       }) {
    SCOPED_TRACE(::testing::Message()
                 << "redirected " << c.redirected << " teed " << c.teed << " shown " << c.shown);
    const StreamRoute route = route_stream(c.redirected, c.teed, c.shown);
    EXPECT_EQ(route.console, c.console);
    EXPECT_EQ(route.to_file, c.to_file);
    EXPECT_EQ(route.filtered, c.filtered);
  }
}

TEST(WorkerOutput, ABareStreamReachesTheConsoleAsWrittenInWholeLines) {
  CapturedFd console;
  WorkerOutput out(ConsoleCopy{console.fd(), std::nullopt}, "", 2);
  put(out, "hel");
  EXPECT_EQ(console.text(), "");  // a line is held until it ends
  put(out, "lo\nsecond\r\nthi");
  EXPECT_EQ(console.text(), "hello\nsecond\r\n");
  put(out, "rd 10%\r");  // a progress bar's "\r" ends a line too
  EXPECT_EQ(console.text(), "hello\nsecond\r\nthird 10%\r");
  put(out, "last");
  out.finish();  // the last line had no newline, and gets none
  EXPECT_EQ(console.text(), "hello\nsecond\r\nthird 10%\rlast");
  EXPECT_EQ(out.tail(), (std::deque<std::string>{"third 10%", "last"}));
}

TEST(WorkerOutput, ATeedStreamIsPrefixedLineByLineAsTorchrunsTailPrintsIt) {
  CapturedFd console;
  const std::string log =
      std::filesystem::temp_directory_path() / ("ddprun-unit-log-" + std::to_string(getpid()));
  {
    WorkerOutput out(ConsoleCopy{console.fd(), "[default1]:"}, log, 3);
    put(out, "hel");
    put(out, "lo\nsecond\r");
    EXPECT_EQ(console.text(), "[default1]:hello\n[default1]:second\n");
    // Universal newlines, as Python's text-mode readline: "\r\n" across two reads is one end.
    put(out, "\nthi\rrd\n\nla");
    EXPECT_EQ(console.text(),
              "[default1]:hello\n[default1]:second\n[default1]:thi\n[default1]:rd\n[default1]:\n");
    put(out, "st");
    out.finish();  // tail_logfile writes the header and the line it read, without a newline
    EXPECT_EQ(console.text(),
              "[default1]:hello\n[default1]:second\n[default1]:thi\n[default1]:rd\n[default1]:\n"
              "[default1]:last");
    EXPECT_EQ(out.tail(), (std::deque<std::string>{"rd", "", "last"}));
  }
  EXPECT_EQ(slurp(log), "hello\nsecond\r\nthi\rrd\n\nlast");  // the file gets the raw bytes
  std::filesystem::remove(log);
}

TEST(WorkerOutput, WithoutAConsoleTheTailIsStillKept) {
  WorkerOutput out(ConsoleCopy{}, "", 1);
  put(out, "Traceback\nValueError: x\n");
  out.finish();
  EXPECT_EQ(out.tail(), (std::deque<std::string>{"ValueError: x"}));
}

TEST(WorkerOutput, TheFilteredCopyTakesMatchingLinesWithTheirPrefix) {
  CapturedFd console;
  CapturedFd copied;
  auto copy =
      std::make_shared<FilteredCopy>(copied.path(), std::vector<std::string>{"loss", "a,b"});
  WorkerOutput out(ConsoleCopy{console.fd(), "[rank3]:"}, "", 0);
  out.duplicate_to(copy);
  put(out, "epoch 1\nloss 0.5\nkeys a,b\nloss");
  out.finish();
  EXPECT_EQ(copied.text(), "[rank3]:loss 0.5\n[rank3]:keys a,b\n[rank3]:loss");
  EXPECT_EQ(console.text(), "[rank3]:epoch 1\n[rank3]:loss 0.5\n[rank3]:keys a,b\n[rank3]:loss");
}

TEST(WorkerOutput, UnwritableFilesAreConfigErrors) {
  EXPECT_THROW(WorkerOutput out(ConsoleCopy{}, "/nonexistent-dir/x.log", 0), ddp::ConfigError);
  EXPECT_THROW(FilteredCopy copy("/nonexistent-dir/filtered_stdout.log", {"x"}), ddp::ConfigError);
}

}  // namespace
}  // namespace ddprun
