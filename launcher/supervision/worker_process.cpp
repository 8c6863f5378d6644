#include "supervision/worker_process.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <sstream>

#include "ddp/error.h"
#include "placement/cpu_list.h"

namespace ddprun {
namespace {

bool is_executable_file(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && access(path.c_str(), X_OK) == 0;
}

std::string errno_text() { return std::strerror(errno); }

// A CPU affinity mask built before fork(), for the child to apply with one system call.
struct ChildAffinity {
  std::vector<unsigned long> words;  // the cpu_set_t; empty: no binding
  std::size_t bytes = 0;
  std::string failure;  // the line the child writes when the kernel refuses

  explicit ChildAffinity(const std::set<int>& cpus) {
    if (cpus.empty()) return;
    bytes = CPU_ALLOC_SIZE(*cpus.rbegin() + 1);
    words.assign(bytes / sizeof(unsigned long) + 1, 0);
    for (int cpu : cpus) CPU_SET_S(cpu, bytes, mask());
    failure = "ddprun: cannot bind this worker to cpus " + format_cpu_list(cpus) +
              " (sched_setaffinity refused them; they may have left the cpuset): run without "
              "--numa-binding or fix the cpuset\n";
  }
  cpu_set_t* mask() { return reinterpret_cast<cpu_set_t*>(words.data()); }
  // In the child: only async-signal-safe calls.
  void apply_or_exit() {
    if (words.empty() || sched_setaffinity(0, bytes, mask()) == 0) return;
    (void)!write(STDERR_FILENO, failure.data(), failure.size());
    _exit(127);
  }
};

}  // namespace

std::string find_program(const std::string& program, const EnvMap& env) {
  if (program.find('/') != std::string::npos) {
    if (!is_executable_file(program)) {
      throw ddp::ConfigError("program '" + program +
                             "' is not an executable file; check the path and its mode");
    }
    return program;
  }
  auto path = env.find("PATH");
  std::istringstream dirs(path != env.end() ? path->second : "/usr/local/bin:/usr/bin:/bin");
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    const std::string candidate = (dir.empty() ? "." : dir) + "/" + program;
    if (is_executable_file(candidate)) return candidate;
  }
  throw ddp::ConfigError("program '" + program +
                         "' was not found on PATH; give its path or install it");
}

WorkerProcess::WorkerProcess(const std::vector<std::string>& argv, const EnvMap& env,
                             const std::set<int>& cpus) {
  // Everything the child needs is built before fork(): between fork and exec only
  // async-signal-safe calls are allowed (the agent has threads: the store server).
  std::vector<std::string> env_entries;
  env_entries.reserve(env.size());
  for (const auto& [k, v] : env) env_entries.push_back(k + "=" + v);
  std::vector<char*> envp;
  for (auto& e : env_entries) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::vector<std::string> args = argv;
  std::vector<char*> argp;
  for (auto& a : args) argp.push_back(a.data());
  argp.push_back(nullptr);
  ChildAffinity affinity(cpus);

  int out[2];
  int err[2];
  if (pipe2(out, O_CLOEXEC) != 0) throw ddp::Error("pipe failed: " + errno_text());
  if (pipe2(err, O_CLOEXEC) != 0) {
    close(out[0]);
    close(out[1]);
    throw ddp::Error("pipe failed: " + errno_text());
  }
  const pid_t parent = getpid();
  const pid_t child = fork();
  if (child < 0) {
    for (int fd : {out[0], out[1], err[0], err[1]}) close(fd);
    throw ddp::Error("fork failed: " + errno_text());
  }
  if (child == 0) {
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);  // the agent died before prctl took effect
    // Where Yama restricts ptrace to ancestors (ptrace_scope 1), the agent and what it runs
    // (eu-stack, gdb) may still take this worker's stacks for a hang diagnosis. A harmless
    // EINVAL without Yama.
    prctl(PR_SET_PTRACER, parent, 0, 0, 0);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    for (int s = 1; s < NSIG; ++s) signal(s, SIG_DFL);
    dup2(out[1], STDOUT_FILENO);
    dup2(err[1], STDERR_FILENO);
    affinity.apply_or_exit();
    syscall(SYS_close_range, 3U, ~0U, 0U);
    execve(argp[0], argp.data(), envp.data());
    const char msg[] = "ddprun: exec failed\n";
    (void)!write(STDERR_FILENO, msg, sizeof(msg) - 1);
    _exit(127);
  }
  setpgid(child, child);  // also here, so signal_group works before the child runs
  close(out[1]);
  close(err[1]);
  fcntl(out[0], F_SETFL, O_NONBLOCK);
  fcntl(err[0], F_SETFL, O_NONBLOCK);
  pid_ = child;
  running_ = true;
  out_fd_ = out[0];
  err_fd_ = err[0];
}

WorkerProcess::WorkerProcess(WorkerProcess&& other) noexcept
    : pid_(other.pid_),
      running_(other.running_),
      status_(other.status_),
      out_fd_(other.out_fd_),
      err_fd_(other.err_fd_) {
  other.pid_ = -1;
  other.running_ = false;
  other.out_fd_ = -1;
  other.err_fd_ = -1;
}

WorkerProcess::~WorkerProcess() {
  if (running_) {
    signal_group(SIGKILL);
    int st = 0;
    waitpid(pid_, &st, 0);
  }
  if (out_fd_ >= 0) close(out_fd_);
  if (err_fd_ >= 0) close(err_fd_);
}

void WorkerProcess::signal_group(int signal) const {
  if (running_) kill(-pid_, signal);
}

bool WorkerProcess::try_reap() {
  if (!running_) return false;
  siginfo_t info{};
  // Look without reaping first: while the leader is a zombie its pid (= the group id) cannot be
  // reused, so killing the rest of the group cannot hit a stranger.
  if (waitid(P_PID, static_cast<id_t>(pid_), &info, WEXITED | WNOHANG | WNOWAIT) != 0 ||
      info.si_pid != pid_) {
    return false;
  }
  kill(-pid_, SIGKILL);
  int st = 0;
  if (waitpid(pid_, &st, 0) != pid_) return false;
  running_ = false;
  if (WIFSIGNALED(st)) {
    status_.signal = WTERMSIG(st);
    status_.code = 128 + status_.signal;
  } else {
    status_.code = WEXITSTATUS(st);
  }
  return true;
}

void reap_orphans(const std::vector<pid_t>& workers) {
  for (;;) {
    siginfo_t info{};
    if (waitid(P_ALL, 0, &info, WEXITED | WNOHANG | WNOWAIT) != 0 || info.si_pid == 0) return;
    if (std::find(workers.begin(), workers.end(), info.si_pid) != workers.end()) return;
    int st = 0;
    waitpid(info.si_pid, &st, 0);
  }
}

}  // namespace ddprun
