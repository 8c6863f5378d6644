#include "child_process.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

namespace ddprun::testing {

using Clock = std::chrono::steady_clock;

ChildProcess::ChildProcess(const std::vector<std::string>& argv,
                           const std::map<std::string, std::string>& env) {
  // A private TMPDIR: what the child leaves there (ddprun keeps its logs after a failure) goes
  // away with the test.
  char dir[] = "/tmp/ddprun-test-XXXXXX";
  temp_dir_ = mkdtemp(dir);
  output_path_ = temp_dir_ + "/output";
  const int out = open(output_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  std::vector<std::string> args = argv;
  std::vector<char*> argp;
  for (auto& a : args) argp.push_back(a.data());
  argp.push_back(nullptr);
  pid_ = fork();
  if (pid_ == 0) {
    setpgid(0, 0);
    setenv("TMPDIR", temp_dir_.c_str(), 1);
    for (const auto& [k, v] : env) {
      if (v.empty()) {
        unsetenv(k.c_str());
      } else {
        setenv(k.c_str(), v.c_str(), 1);
      }
    }
    const int devnull = open("/dev/null", O_RDONLY);
    dup2(devnull, STDIN_FILENO);
    dup2(out, STDOUT_FILENO);
    dup2(out, STDERR_FILENO);
    execv(argp[0], argp.data());
    _exit(127);
  }
  setpgid(pid_, pid_);
  close(out);
}

ChildProcess::~ChildProcess() {
  if (!reaped_) {
    kill_group();
    int st = 0;
    waitpid(pid_, &st, 0);
  }
  std::error_code ignored;
  std::filesystem::remove_all(temp_dir_, ignored);
}

std::optional<int> ChildProcess::wait(std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (!reaped_) {
    int st = 0;
    const pid_t r = waitpid(pid_, &st, WNOHANG);
    if (r == pid_) {
      reaped_ = true;
      exit_code_ = WIFSIGNALED(st) ? 128 + WTERMSIG(st) : WEXITSTATUS(st);
      break;
    }
    if (Clock::now() >= deadline) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return exit_code_;
}

bool ChildProcess::wait_for_output(const std::string& text, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    if (output().find(text) != std::string::npos) return true;
    if (reaped_) return false;
    int st = 0;
    if (waitpid(pid_, &st, WNOHANG) == pid_) {
      reaped_ = true;
      exit_code_ = WIFSIGNALED(st) ? 128 + WTERMSIG(st) : WEXITSTATUS(st);
      return output().find(text) != std::string::npos;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

std::string ChildProcess::output() const {
  std::ifstream in(output_path_);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void ChildProcess::signal(int sig) const {
  if (!reaped_) kill(pid_, sig);
}

void ChildProcess::kill_group() const {
  if (!reaped_) kill(-pid_, SIGKILL);
}

bool process_alive(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  if (!stat) return false;
  std::string line;
  std::getline(stat, line);
  const auto close_paren = line.rfind(')');
  return close_paren != std::string::npos && close_paren + 2 < line.size() &&
         line[close_paren + 2] != 'Z';
}

std::vector<pid_t> printed_pids(const std::string& output, const std::string& key) {
  std::vector<pid_t> pids;
  const std::regex pattern(key + "([0-9]+)");
  for (auto it = std::sregex_iterator(output.begin(), output.end(), pattern);
       it != std::sregex_iterator(); ++it) {
    pids.push_back(static_cast<pid_t>(std::stol((*it)[1].str())));
  }
  return pids;
}

bool wait_all_dead(const std::vector<pid_t>& pids, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    bool any = false;
    for (pid_t p : pids) any = any || process_alive(p);
    if (!any) return true;
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

int count_of(const std::string& text, const std::string& needle) {
  int n = 0;
  for (auto pos = text.find(needle); pos != std::string::npos; pos = text.find(needle, pos + 1)) {
    ++n;
  }
  return n;
}

SilentNode::SilentNode(const ChildProcess& node) {
  const auto workers = printed_pids(node.output());
  pids_ = {node.pid()};
  if (!workers.empty()) pids_.push_back(workers.front());
  ok_ = workers.size() >= 1;
  for (pid_t p : pids_) ok_ = kill(p, SIGSTOP) == 0 && ok_;
}

SilentNode::~SilentNode() {
  for (pid_t p : pids_) kill(p, SIGKILL);
}

}  // namespace ddprun::testing
