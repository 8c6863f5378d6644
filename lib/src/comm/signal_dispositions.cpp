#include "comm/signal_dispositions.h"

#include <cstring>

namespace ddp::detail {
namespace {

bool same_disposition(const struct sigaction& a, const struct sigaction& b) {
  // sa_handler and sa_sigaction share storage: comparing one compares the installed function.
  return a.sa_handler == b.sa_handler && a.sa_flags == b.sa_flags;
}

}  // namespace

SignalDispositionGuard::SignalDispositionGuard() {
  // The standard signals only: real-time ones belong to threading libraries and our own
  // stuck-call guard, none of which a library constructor has reason to take.
  for (int s = 1; s < SIGRTMIN; ++s) {
    // SIGPIPE is left to the libraries: one that ignores it may write to sockets without
    // MSG_NOSIGNAL, and ignoring it only turns a dead peer into an error return.
    if (s == SIGKILL || s == SIGSTOP || s == SIGPIPE) continue;
    Saved entry{s, {}};
    if (sigaction(s, nullptr, &entry.action) == 0) saved_.push_back(entry);
  }
}

SignalDispositionGuard::~SignalDispositionGuard() {
  if (!restored_) restore();
}

std::vector<std::string> SignalDispositionGuard::restore() {
  restored_ = true;
  std::vector<std::string> changed;
  for (const Saved& entry : saved_) {
    struct sigaction now {};
    if (sigaction(entry.signal, nullptr, &now) != 0 || same_disposition(now, entry.action))
      continue;
    sigaction(entry.signal, &entry.action, nullptr);
    const char* name = sigabbrev_np(entry.signal);
    changed.push_back(name != nullptr ? std::string("SIG") + name : std::to_string(entry.signal));
  }
  return changed;
}

}  // namespace ddp::detail
