// The file-timer watchdog: torchelastic's pipe protocol, which timers expire, and the signal
// reaching only this round's workers.
#include "supervision/file_timer.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>

#include "ddp/error.h"

namespace ddprun {
namespace {

using namespace std::chrono_literals;

TEST(TimerRequest, ParsesFileTimerClientsLines) {
  auto r = parse_timer_request(
      R"({"version": 1, "pid": 42, "scope_id": "train.py#7", "expiration_time": 1700000000.5, "signal": 9})");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->pid, 42);
  EXPECT_EQ(r->scope_id, "train.py#7");
  EXPECT_DOUBLE_EQ(r->expiration_time, 1700000000.5);
  EXPECT_EQ(r->signal, 9);
  r = parse_timer_request(
      R"({"version": 1, "pid": 42, "scope_id": "s", "expiration_time": -1, "signal": 0})");
  ASSERT_TRUE(r);
  EXPECT_LT(r->expiration_time, 0);
  EXPECT_FALSE(parse_timer_request(R"({"version": 2, "pid": 1, "expiration_time": 1})"));
  EXPECT_FALSE(parse_timer_request(R"({"version": 1, "pid": "x", "expiration_time": 1})"));
  EXPECT_FALSE(parse_timer_request("not json"));
  // Fields of the wrong type, from any writer: refused, never thrown.
  EXPECT_FALSE(parse_timer_request(R"({"version": "1", "pid": 1, "expiration_time": 1})"));
  EXPECT_FALSE(
      parse_timer_request(R"({"version": 1, "pid": 1, "expiration_time": 1, "scope_id": null})"));
  EXPECT_FALSE(parse_timer_request(
      R"({"version": 1, "pid": 1, "expiration_time": 1, "signal": "SIGKILL"})"));
  EXPECT_FALSE(parse_timer_request(R"({"version": 1, "pid": 0, "expiration_time": 1})"));
  EXPECT_FALSE(parse_timer_request(R"({"version": 1, "pid": 99999999999, "expiration_time": 1})"));
}

TEST(TimerBook, ReleasedTimersNeverExpireAndAPidIsSignalledOnce) {
  TimerBook book;
  book.apply({10, "a", 100, 9});
  book.apply({10, "b", 50, 0});  // expires first but asks for no signal
  book.apply({11, "c", 100, 15});
  book.apply({11, "c", -1, 0});  // released
  book.apply({12, "d", 200, 9});
  EXPECT_TRUE(book.take_expired(40).empty());
  const auto expired = book.take_expired(150);
  ASSERT_EQ(expired.size(), 1u);
  EXPECT_EQ(expired[0].pid, 10);
  EXPECT_EQ(expired[0].scope_id, "a");
  EXPECT_EQ(expired[0].signal, 9);
  EXPECT_EQ(book.size(), 1u);  // pid 10's timers are gone; pid 12's is still running
  EXPECT_TRUE(book.take_expired(150).empty());
}

void write_line(const std::string& path, const std::string& line) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_NONBLOCK);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::write(fd, line.data(), line.size()), static_cast<ssize_t>(line.size()));
  ::close(fd);
}

double epoch_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

TEST(FileTimerServer, AnExpiredSectionKillsItsWorkerAndNamesTheScope) {
  const pid_t worker = ::fork();
  ASSERT_GE(worker, 0);
  if (worker == 0) {
    ::sleep(20);  // the stuck section
    ::_exit(0);
  }
  const pid_t stranger = ::fork();
  ASSERT_GE(stranger, 0);
  if (stranger == 0) {
    ::sleep(3);
    ::_exit(0);
  }
  const std::string path = "/tmp/ddprun-timer-test-" + std::to_string(::getpid());
  {
    FileTimerServer server(path, [worker](pid_t pid) { return pid == worker; });
    char line[256];
    for (pid_t pid : {worker, stranger}) {
      std::snprintf(line, sizeof line,
                    "{\"version\": 1, \"pid\": %d, \"scope_id\": \"step\", "
                    "\"expiration_time\": %.3f, \"signal\": 9}\n",
                    static_cast<int>(pid), epoch_now() + 0.2);
      write_line(path, line);
    }
    const auto start = std::chrono::steady_clock::now();
    int status = 0;
    ASSERT_EQ(::waitpid(worker, &status, 0), worker);
    EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    EXPECT_LT(std::chrono::steady_clock::now() - start, 10s);
    EXPECT_EQ(server.reason_for(worker),
              "its timer 'step' expired: the file-timer watchdog sent SIGKILL");
    EXPECT_FALSE(server.reason_for(stranger));
  }
  // The stranger was not ours: it ran its course.
  int status = 0;
  ASSERT_EQ(::waitpid(stranger, &status, 0), stranger);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_NE(::access(path.c_str(), F_OK), 0);  // the pipe is gone with the server
}

TEST(FileTimerServer, APathHoldingAnythingButAPipeIsLeftAloneAndNamed) {
  const std::string path = "/tmp/ddprun-timer-file-" + std::to_string(::getpid());
  { std::ofstream(path) << "data\n"; }
  try {
    FileTimerServer server(path, [](pid_t) { return true; });
    ADD_FAILURE() << "expected a ConfigError";
  } catch (const ddp::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("exists and is not a named pipe"), std::string::npos)
        << e.what();
  }
  std::ifstream kept(path);
  std::string line;
  std::getline(kept, line);
  EXPECT_EQ(line, "data");
  ::unlink(path.c_str());
}

}  // namespace
}  // namespace ddprun
