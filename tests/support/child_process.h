#pragma once
// A child process for the multi-process launcher tests: started in its own process group with
// its output captured to a file, waited for with a hard deadline, and killed (its whole group,
// by PID) when the test ends however it ends.
#include <sys/types.h>

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace ddprun::testing {

class ChildProcess {
 public:
  // Starts argv[0] (a path) with the test's environment plus `env` ("" values unset a
  // variable), and TMPDIR set to a directory of its own that is removed with it.
  ChildProcess(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env);
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const { return pid_; }
  // The exit code (128 + N when killed by signal N), or nullopt if still running at the deadline.
  std::optional<int> wait(std::chrono::milliseconds timeout);
  // Waits until the captured output contains `text`; false at the deadline or if it exited.
  bool wait_for_output(const std::string& text, std::chrono::milliseconds timeout);
  std::string output() const;
  void signal(int sig) const;
  void kill_group() const;

 private:
  pid_t pid_ = -1;
  bool reaped_ = false;
  int exit_code_ = -1;
  std::string temp_dir_;
  std::string output_path_;
};

// Alive means it exists and is not a zombie.
bool process_alive(pid_t pid);
// Every "pid=N" printed by the test worker or shell workers in `output`.
std::vector<pid_t> printed_pids(const std::string& output, const std::string& key = "pid=");
// Waits until none of `pids` is alive; false at the deadline.
bool wait_all_dead(const std::vector<pid_t>& pids, std::chrono::milliseconds timeout);
// Number of times `needle` occurs in `text`.
int count_of(const std::string& text, const std::string& needle);

// A node that falls silent without closing a socket (as one that loses power or its network):
// SIGSTOPs the agent `node` and the first worker it printed ("pid=N"); the destructor SIGKILLs
// both. `ok()` says whether both were stopped.
class SilentNode {
 public:
  explicit SilentNode(const ChildProcess& node);
  ~SilentNode();
  SilentNode(const SilentNode&) = delete;
  SilentNode& operator=(const SilentNode&) = delete;
  bool ok() const { return ok_; }

 private:
  std::vector<pid_t> pids_;
  bool ok_ = true;
};

}  // namespace ddprun::testing
