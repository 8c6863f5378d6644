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

// The calling thread's CPU clock, computed once per thread.
clockid_t this_threads_cpu_clock() {
  __attribute__((tls_model("initial-exec"))) static thread_local clockid_t clock = [] {
    clockid_t id = CLOCK_THREAD_CPUTIME_ID;
    pthread_getcpuclockid(pthread_self(), &id);
    return id;
  }();
  return clock;
}

// CPU time `clock` has used; `fallback` when the thread is gone.
std::chrono::nanoseconds cpu_time(clockid_t clock, std::chrono::nanoseconds fallback) {
  timespec t{};
  if (clock_gettime(clock, &t) != 0) return fallback;
  return std::chrono::seconds(t.tv_sec) + std::chrono::nanoseconds(t.tv_nsec);
}

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

StuckCallGuard::StuckCallGuard(std::chrono::milliseconds cpu_limit,
                               std::chrono::milliseconds wall_limit)
    : cpu_limit_(cpu_limit), wall_limit_(wall_limit) {
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
  caller_cpu_clock_.store(this_threads_cpu_clock(), std::memory_order_relaxed);
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

std::string StuckCallGuard::last_abandoned_reason() const {
  switch (reason_.load(std::memory_order_acquire)) {
    case Reason::kSpinning:
      return "spun for " + std::to_string(cpu_limit_.count()) + " ms of CPU time";
    case Reason::kOverran:
      return "ran for " + std::to_string(wall_limit_.count()) + " ms";
    case Reason::kNone:
      break;
  }
  return "was abandoned";
}

void StuckCallGuard::watch() {
  const auto period =
      std::max(std::chrono::milliseconds(20), std::min(cpu_limit_, wall_limit_) / 5);
  unsigned long seen_calls = 0;
  auto wall_at_sight = std::chrono::steady_clock::now();
  std::chrono::nanoseconds cpu_at_sight{0};
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_cv_.wait_for(lock, period, [this] { return stopping_; })) {
    const auto now = std::chrono::steady_clock::now();
    const unsigned long calls = calls_.load(std::memory_order_relaxed);
    const clockid_t clock = caller_cpu_clock_.load(std::memory_order_relaxed);
    if (!in_call_.load(std::memory_order_acquire) || calls != seen_calls) {
      // A new call (or none): its limits count from here, up to one period after it began.
      seen_calls = calls;
      wall_at_sight = now;
      cpu_at_sight = cpu_time(clock, cpu_at_sight);
      continue;
    }
    const auto cpu_now = cpu_time(clock, cpu_at_sight);
    Reason reason = Reason::kNone;
    if (cpu_now - cpu_at_sight >= cpu_limit_) {
      reason = Reason::kSpinning;
    } else if (now - wall_at_sight >= wall_limit_) {
      reason = Reason::kOverran;
    }
    if (reason == Reason::kNone) continue;
    reason_.store(reason, std::memory_order_release);
    pthread_kill(caller_.load(std::memory_order_relaxed), escape_signal());
    // Once per limit, should the first signal land outside the call.
    wall_at_sight = now;
    cpu_at_sight = cpu_now;
  }
}

}  // namespace ddp::detail::fabric
