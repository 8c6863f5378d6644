#pragma once
// One worker process: its own process group (so a signal reaches everything it started), dies
// with the agent (PR_SET_PDEATHSIG), stdout and stderr on pipes the agent reads.
#include <sys/types.h>

#include <set>
#include <string>
#include <vector>

#include "config/host_facts.h"

namespace ddprun {

// The path execve() needs for `program`: as given when it contains '/', else searched on the
// PATH of `env`. Throws ddp::ConfigError when it is not an executable file.
std::string find_program(const std::string& program, const EnvMap& env);

struct ExitStatus {
  int code = 0;    // shell convention: the exit code, or 128 + signal
  int signal = 0;  // the signal that killed it, 0 if it exited
};

class WorkerProcess {
 public:
  // Starts `argv` (argv[0] already resolved by find_program) with exactly `env`, bound to
  // `cpus` when not empty (sched_setaffinity between fork and exec; a worker the kernel does not
  // let bind writes one line to its stderr and exits 127, as when exec fails).
  WorkerProcess(const std::vector<std::string>& argv, const EnvMap& env,
                const std::set<int>& cpus = {});
  ~WorkerProcess();
  WorkerProcess(WorkerProcess&& other) noexcept;
  WorkerProcess(const WorkerProcess&) = delete;
  WorkerProcess& operator=(const WorkerProcess&) = delete;
  WorkerProcess& operator=(WorkerProcess&&) = delete;

  pid_t pid() const { return pid_; }
  bool running() const { return running_; }
  const ExitStatus& status() const { return status_; }
  // Read ends of the worker's stdout and stderr (-1 once closed by the owner).
  int& stdout_fd() { return out_fd_; }
  int& stderr_fd() { return err_fd_; }

  // Sends `signal` to the worker's whole process group.
  void signal_group(int signal) const;
  // If the worker has exited: kills what is left of its group, reaps it and returns true.
  bool try_reap();

 private:
  pid_t pid_ = -1;
  bool running_ = false;
  ExitStatus status_;
  int out_fd_ = -1;
  int err_fd_ = -1;
};

// Reaps children that are not workers (orphans re-parented to ddprun, the child subreaper).
void reap_orphans(const std::vector<pid_t>& workers);

}  // namespace ddprun
