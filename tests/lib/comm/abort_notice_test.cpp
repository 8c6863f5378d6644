// The launcher's abort notice (comm/abort_notice.h): the first reason stands, and a watched
// DDP_ABORT_FILE ends a process blocked where nothing can wake it with a CommError naming the
// reason, in its error file and exit code. Process-wide state: every case runs in a forked child.
#include "comm/abort_notice.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>

#include "ddp/exit_codes.h"

namespace ddp::detail {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Runs `child` in a forked process (its exit code is what it returns) and waits for it, at most
// `limit` (then SIGKILL). Returns the status and how long it took.
std::pair<int, Clock::duration> in_child(int (*child)(), Clock::duration limit,
                                         const std::function<void()>& meanwhile = {}) {
  const auto start = Clock::now();
  const pid_t pid = fork();
  if (pid == 0) _exit(child());
  if (meanwhile) meanwhile();
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (Clock::now() - start > limit) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      break;
    }
    std::this_thread::sleep_for(10ms);
  }
  return {status, Clock::now() - start};
}

TEST(AbortNotice, TheFirstReasonStands) {
  const auto [status, took] = in_child(
      [] {
        if (AbortNotice::raised() || !AbortNotice::reason().empty()) return 1;
        AbortNotice::raise("node 1 (pod-1) was lost");
        AbortNotice::raise("a later reason");
        if (!AbortNotice::raised()) return 2;
        if (AbortNotice::message() != "aborted by ddprun: node 1 (pod-1) was lost") return 3;
        return 0;
      },
      10s);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
}

TEST(AbortNotice, WithoutTheFileNothingWatches) {
  const auto [status, took] = in_child(
      [] {
        ::unsetenv("DDP_ABORT_FILE");
        AbortNotice::watch_file_from_environment(0);
        std::this_thread::sleep_for(1500ms);  // past the grace: nothing ends this process
        return AbortNotice::raised() ? 1 : 0;
      },
      10s);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
}

TEST(AbortNotice, AWatchedFileEndsABlockedProcessWithTheCommErrorInItsErrorFile) {
  char dir[] = "/tmp/ddp-abort-notice-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  static std::string abort_file, error_file;
  abort_file = std::string(dir) + "/abort";
  error_file = std::string(dir) + "/error.json";
  const auto [status, took] = in_child(
      [] {
        ::setenv("DDP_ABORT_FILE", abort_file.c_str(), 1);
        ::setenv("TORCHELASTIC_ERROR_FILE", error_file.c_str(), 1);
        AbortNotice::watch_file_from_environment(3);
        std::this_thread::sleep_for(30s);  // as a wait inside gloo: nothing wakes it
        return 1;
      },
      20s,
      [] {
        std::this_thread::sleep_for(300ms);
        std::ofstream(abort_file + ".partial") << "node 1 (pod-1) was lost: no heartbeat\n";
        std::rename((abort_file + ".partial").c_str(), abort_file.c_str());
      });
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), exit_code::kComm);
  // Read within 100 ms, then the 1 s grace.
  EXPECT_GE(took, 300ms + AbortNotice::kGrace);
  EXPECT_LT(took, 300ms + AbortNotice::kGrace + 5s);
  const std::string error = read_text(error_file);
  EXPECT_NE(error.find("CommError"), std::string::npos) << error;
  EXPECT_NE(error.find("aborted by ddprun: node 1 (pod-1) was lost: no heartbeat"),
            std::string::npos)
      << error;
  EXPECT_NE(error.find("collective failed on rank 3"), std::string::npos) << error;
  std::filesystem::remove_all(dir);
}

// The last words (the trainer's checkpoint of its last step): the watcher says them before it
// ends a process blocked where nothing wakes it; said once, however many threads ask.
TEST(AbortNotice, TheWatcherSaysTheLastWordsOnceBeforeEndingABlockedProcess) {
  char dir[] = "/tmp/ddp-abort-notice-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  static std::string abort_file, words_file;
  abort_file = std::string(dir) + "/abort";
  words_file = std::string(dir) + "/words";
  const auto [status, took] = in_child(
      [] {
        ::setenv("DDP_ABORT_FILE", abort_file.c_str(), 1);
        ::unsetenv("TORCHELASTIC_ERROR_FILE");
        AbortNotice::set_last_words([] { std::ofstream(words_file, std::ios::app) << "said\n"; });
        AbortNotice::watch_file_from_environment(0);
        std::this_thread::sleep_for(30s);  // blocked, as in gloo
        return 1;
      },
      20s,
      [] {
        std::this_thread::sleep_for(300ms);
        std::ofstream(abort_file) << "node 1 (pod-1) was lost\n";
      });
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), exit_code::kComm);
  EXPECT_EQ(read_text(words_file), "said\n");
  std::filesystem::remove_all(dir);
}

TEST(AbortNotice, LastWordsAreSaidOnceAndClearingThemWaitsForTheirEnd) {
  const auto [status, took] = in_child(
      [] {
        static std::atomic<int> said{0};
        static std::atomic<bool> done{false};
        AbortNotice::set_last_words([] {
          ++said;
          std::this_thread::sleep_for(300ms);
          done = true;
        });
        std::thread first([] { AbortNotice::say_last_words(); });
        std::this_thread::sleep_for(50ms);
        AbortNotice::say_last_words();  // waits for the first, says nothing more
        if (!done) return 1;
        AbortNotice::set_last_words([] { ++said; });
        AbortNotice::set_last_words(nullptr);
        AbortNotice::say_last_words();
        first.join();
        return said == 1 ? 0 : 2;
      },
      10s);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
}

// In-process regrouping: an armed process takes a regroup notice as such (raised, wakers run
// for "regroup:", the process lives on), clears it once regrouped, takes the next notice, and
// still ends on a plain reason written over a notice (ddprun fell back to a restart).
std::string regroup_file_path;

void write_notice(const std::string& text) {
  std::ofstream(regroup_file_path + ".partial") << text << "\n";
  std::rename((regroup_file_path + ".partial").c_str(), regroup_file_path.c_str());
}

bool within(Clock::duration limit, const std::function<bool()>& condition) {
  const auto end = Clock::now() + limit;
  while (!condition()) {
    if (Clock::now() > end) return false;
    std::this_thread::sleep_for(5ms);
  }
  return true;
}

TEST(AbortNotice, AnArmedProcessRegroupsOnANoticeAndEndsOnAPlainReasonOverIt) {
  char dir[] = "/tmp/ddp-abort-notice-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  regroup_file_path = std::string(dir) + "/abort";
  const auto [status, took] = in_child(
      [] {
        static std::atomic<int> woken{0};
        ::setenv("DDP_ABORT_FILE", regroup_file_path.c_str(), 1);
        ::unsetenv("TORCHELASTIC_ERROR_FILE");
        AbortNotice::arm_regroup(true);
        AbortNotice::add_waker(&woken, [] { ++woken; });
        AbortNotice::watch_file_from_environment(0);
        write_notice("regroup: node 2 (pod-2) was lost");
        if (!within(2s, [] { return AbortNotice::regroup() == AbortNotice::Regroup::kNow; })) {
          return 1;
        }
        if (AbortNotice::reason() != "node 2 (pod-2) was lost" || woken != 1) return 2;
        std::this_thread::sleep_for(AbortNotice::kGrace + 300ms);  // no end after the grace
        std::filesystem::remove(regroup_file_path);
        AbortNotice::clear();
        if (AbortNotice::raised() || AbortNotice::regroup() != AbortNotice::Regroup::kNone)
          return 3;
        std::this_thread::sleep_for(300ms);  // the watcher reads the file again: none
        if (AbortNotice::raised()) return 4;
        write_notice("regroup after step: 1 node waiting to join");
        if (!within(2s,
                    [] { return AbortNotice::regroup() == AbortNotice::Regroup::kAfterStep; })) {
          return 5;
        }
        if (woken != 1) return 6;  // a join wakes nothing: the ranks stop after the step
        write_notice("node 0 (pod-0) was lost");  // the fallback: the process ends
        std::this_thread::sleep_for(10s);
        return 7;
      },
      20s);
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), exit_code::kComm);
  std::filesystem::remove_all(dir);
}

TEST(AbortNotice, AnUnarmedProcessTakesARegroupNoticeAsAnAbort) {
  char dir[] = "/tmp/ddp-abort-notice-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  regroup_file_path = std::string(dir) + "/abort";
  const auto [status, took] = in_child(
      [] {
        ::setenv("DDP_ABORT_FILE", regroup_file_path.c_str(), 1);
        ::unsetenv("TORCHELASTIC_ERROR_FILE");
        AbortNotice::watch_file_from_environment(0);
        write_notice("regroup: node 2 (pod-2) was lost");
        if (!within(2s, [] { return AbortNotice::raised(); })) return 1;
        if (AbortNotice::regroup() != AbortNotice::Regroup::kNone) return 2;
        if (AbortNotice::message() != "aborted by ddprun: node 2 (pod-2) was lost") return 3;
        std::this_thread::sleep_for(10s);
        return 4;
      },
      20s);
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), exit_code::kComm);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace ddp::detail
