#pragma once
// The watchdog of torchelastic's file timer (TORCHELASTIC_ENABLE_FILE_TIMER=1): a worker that
// calls timer.configure(FileTimerClient(os.environ["TORCHELASTIC_TIMER_FILE"])) and then
// `with timer.expires(after=60, scope="step"):` writes a request to a named pipe on entry and a
// release on exit; when a section outlives its expiration, the agent sends the worker the
// requested signal (SIGKILL by default). The pipe protocol is FileTimerServer's
// (torch/distributed/elastic/timer/file_based_local_timer.py), one JSON object per line:
//   {"version": 1, "pid": 123, "scope_id": "train.py#42", "expiration_time": 1733...,
//    "signal": 9}          (expiration_time: epoch seconds; -1 with signal 0 releases)
// Unlike torchelastic, the watchdog signals only this round's workers (a pid or a process in a
// worker's group), never itself, and the failure it causes names the expired scope.
#include <sys/types.h>

#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace ddprun {

struct TimerRequest {
  pid_t pid = 0;
  std::string scope_id;
  double expiration_time = -1;  // epoch seconds; negative releases the scope
  int signal = 0;
};

// One line of the pipe; nullopt for one that is not a version-1 request.
std::optional<TimerRequest> parse_timer_request(const std::string& line);

// The live timers by (pid, scope). Pure: the clock is an argument.
class TimerBook {
 public:
  struct Expiry {
    pid_t pid = 0;
    std::string scope_id;
    int signal = 0;
  };
  void apply(const TimerRequest& request);
  // Per pid with an expired timer: the earliest expired one that asks for a signal (a timer
  // with signal 0 only expires). Every timer of those pids is dropped.
  std::vector<Expiry> take_expired(double now);
  std::size_t size() const { return timers_.size(); }

 private:
  std::map<std::pair<pid_t, std::string>, std::pair<double, int>> timers_;
};

class FileTimerServer {
 public:
  // Makes the pipe at `path` (replacing any file there) and watches it on a thread of its own;
  // `ours` says whether a pid may be signalled. Throws ddp::ConfigError naming the variable when
  // the pipe cannot be made.
  FileTimerServer(std::string path, std::function<bool(pid_t)> ours);
  ~FileTimerServer();
  FileTimerServer(const FileTimerServer&) = delete;
  FileTimerServer& operator=(const FileTimerServer&) = delete;

  const std::string& path() const { return path_; }
  // "its timer 'scope' expired: the file-timer watchdog sent SIGKILL" for a pid it signalled.
  std::optional<std::string> reason_for(pid_t pid) const;

 private:
  void serve();
  void reap(double now);

  std::string path_;
  std::function<bool(pid_t)> ours_;
  int read_fd_ = -1;
  int keep_open_fd_ = -1;  // a writer of our own: the pipe never reads EOF between clients
  int stop_fds_[2] = {-1, -1};
  TimerBook book_;
  mutable std::mutex mutex_;
  std::map<pid_t, std::string> reasons_;
  std::thread thread_;
};

}  // namespace ddprun
