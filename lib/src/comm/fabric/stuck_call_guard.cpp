#include "comm/fabric/stuck_call_guard.h"

#include <unistd.h>
#include <algorithm>

#include <csignal>

namespace ddp::detail::fabric {
namespace {

// A real-time signal nothing else in the process is expected to use.
int escape_signal() { return SIGRTMIN + 7; }

// Initial-exec TLS: reading it from a signal handler must not allocate.
__attribute__((tls_model("initial-exec"))) thread_local sigjmp_buf* t_escape = nullptr;

void on_escape_signal(int) {
  if (t_escape) siglongjmp(*t_escape, 1);
}

void install_handler_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction action {};
    action.sa_handler = on_escape_signal;
    sigemptyset(&action.sa_mask);
    sigaction(escape_signal(), &action, nullptr);
  });
}

}  // namespace

StuckCallGuard::StuckCallGuard(std::chrono::milliseconds limit) : limit_(limit) {
  install_handler_once();
  watchdog_ = std::thread([this] { watch(); });
}

StuckCallGuard::~StuckCallGuard() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  stop_cv_.notify_all();
  watchdog_.join();
}

void StuckCallGuard::enter(sigjmp_buf* escape) {
  t_escape = escape;
  caller_.store(pthread_self(), std::memory_order_relaxed);
  calls_.fetch_add(1, std::memory_order_relaxed);
  in_call_.store(true, std::memory_order_release);
}

void StuckCallGuard::leave() {
  in_call_.store(false, std::memory_order_release);
  t_escape = nullptr;
}

bool StuckCallGuard::abandoned() {
  // The handler ran with the signal blocked and the jump did not restore the mask.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, escape_signal());
  pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
  leave();
  return false;
}

void StuckCallGuard::watch() {
  const auto period = std::max(std::chrono::milliseconds(20), limit_ / 5);
  unsigned long seen_calls = 0;
  auto same_call_since = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_cv_.wait_for(lock, period, [this] { return stopping_; })) {
    const auto now = std::chrono::steady_clock::now();
    const unsigned long calls = calls_.load(std::memory_order_relaxed);
    if (!in_call_.load(std::memory_order_acquire) || calls != seen_calls) {
      seen_calls = calls;
      same_call_since = now;
      continue;
    }
    if (now - same_call_since >= limit_) {
      pthread_kill(caller_.load(std::memory_order_relaxed), escape_signal());
      same_call_since = now;  // once per limit, should the first signal land outside the call
    }
  }
}

}  // namespace ddp::detail::fabric
