#pragma once
// Keeps a library load from changing how the process answers signals. libfabric links PSM's
// libinfinipath, whose constructor installs handlers for SIGTERM, SIGINT, SIGSEGV, SIGBUS,
// SIGILL and SIGABRT that exit(1): a worker stopped by its launcher would exit 1 instead of
// 128+SIGTERM, and a crash would lose its core dump. Save before dlopen, restore after.
#include <csignal>
#include <string>
#include <vector>

namespace ddp::detail {

class SignalDispositionGuard {
 public:
  SignalDispositionGuard();
  // Restores every disposition that changed since construction (standard signals but SIGPIPE).
  ~SignalDispositionGuard();
  SignalDispositionGuard(const SignalDispositionGuard&) = delete;
  SignalDispositionGuard& operator=(const SignalDispositionGuard&) = delete;

  // Restores now; returns the names of the signals whose disposition had changed.
  std::vector<std::string> restore();

 private:
  struct Saved {
    int signal;
    struct sigaction action;
  };
  std::vector<Saved> saved_;
  bool restored_ = false;
};

}  // namespace ddp::detail
