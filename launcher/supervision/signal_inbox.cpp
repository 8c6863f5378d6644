#include "supervision/signal_inbox.h"

#include <sys/signalfd.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>
#include <string>

#include "ddp/error.h"

namespace ddprun {

SignalInbox::SignalInbox(const std::vector<int>& handled) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGCHLD);
  for (int s : handled) sigaddset(&set, s);
  if (pthread_sigmask(SIG_BLOCK, &set, nullptr) != 0) {
    throw ddp::Error("cannot block signals: " + std::string(std::strerror(errno)));
  }
  fd_ = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
  if (fd_ < 0) throw ddp::Error("signalfd failed: " + std::string(std::strerror(errno)));
}

SignalInbox::~SignalInbox() {
  if (fd_ >= 0) close(fd_);
}

int SignalInbox::take() {
  signalfd_siginfo info{};
  const ssize_t n = read(fd_, &info, sizeof(info));
  if (n != static_cast<ssize_t>(sizeof(info))) return 0;
  return static_cast<int>(info.ssi_signo);
}

int SignalInbox::take_termination() {
  for (int s = take(); s != 0; s = take()) {
    if (s != SIGCHLD) return s;
  }
  return 0;
}

}  // namespace ddprun
