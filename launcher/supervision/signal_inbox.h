#pragma once
// Signals arrive as readable data on a file descriptor (signalfd), so the supervisor's one
// poll() loop sees worker exits (SIGCHLD), termination requests and worker output together.
// Must be created before any thread starts, so that every thread inherits the blocked mask.
#include <vector>

namespace ddprun {

class SignalInbox {
 public:
  // Blocks SIGCHLD and `handled` in this thread and opens a signalfd for them.
  explicit SignalInbox(const std::vector<int>& handled);
  ~SignalInbox();
  SignalInbox(const SignalInbox&) = delete;
  SignalInbox& operator=(const SignalInbox&) = delete;

  int fd() const { return fd_; }
  // The next pending signal, or 0 when none is pending.
  int take();
  // The first pending signal other than SIGCHLD (SIGCHLD ones are dropped), or 0.
  int take_termination();

 private:
  int fd_ = -1;
};

}  // namespace ddprun
