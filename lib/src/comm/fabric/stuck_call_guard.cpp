#include "comm/fabric/stuck_call_guard.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstring>

namespace ddp::detail::fabric {
namespace {

// Initial-exec TLS: reading it from a signal handler must not allocate.
__attribute__((tls_model("initial-exec"))) thread_local sigjmp_buf* t_escape = nullptr;
// The number of the call this thread is in, and where its guard names the call it abandons: a
// signal meant for a call that returned before it landed must not abandon the next one.
__attribute__((tls_model("initial-exec"))) thread_local unsigned long t_call = 0;
__attribute__((tls_model("initial-exec"))) thread_local const std::atomic<unsigned long>* t_doomed =
    nullptr;
// This thread's id, looked up once (a system call).
__attribute__((tls_model("initial-exec"))) thread_local pid_t t_tid = 0;

// CPU time `clock` has used; `fallback` when the thread is gone.
std::chrono::nanoseconds cpu_time(clockid_t clock, std::chrono::nanoseconds fallback) {
  timespec t{};
  if (clock_gettime(clock, &t) != 0) return fallback;
  return std::chrono::seconds(t.tv_sec) + std::chrono::nanoseconds(t.tv_nsec);
}

// Whether thread `tid` of this process is runnable: running, or ready and waiting for a core.
// False when it sleeps in the kernel (a lock's futex, poll) or cannot be read.
bool runnable(pid_t tid) {
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/self/task/%d/stat", static_cast<int>(tid));
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char stat[512];
  const ssize_t got = ::read(fd, stat, sizeof(stat) - 1);
  ::close(fd);
  if (got <= 0) return false;
  stat[got] = '\0';
  // "tid (comm) S ...": the name may hold spaces and parentheses, the state follows the last ')'.
  const char* end_of_name = std::strrchr(stat, ')');
  return end_of_name && end_of_name[1] == ' ' && end_of_name[2] == 'R';
}

void on_escape_signal(int) {
  if (t_escape && t_doomed && t_doomed->load(std::memory_order_relaxed) == t_call) {
    siglongjmp(*t_escape, 1);
  }
}

void install_handler_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction action {};
    action.sa_handler = on_escape_signal;
    sigemptyset(&action.sa_mask);
    sigaction(StuckCallGuard::escape_signal(), &action, nullptr);
  });
}

}  // namespace

StuckCallGuard::StuckCallGuard(std::chrono::milliseconds cpu_limit,
                               std::chrono::milliseconds wall_limit,
                               std::function<bool()> lock_holder_gone)
    : cpu_limit_(cpu_limit),
      wall_limit_(wall_limit),
      lock_holder_gone_(std::move(lock_holder_gone)) {
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

int StuckCallGuard::escape_signal() { return SIGRTMIN + 7; }

void StuckCallGuard::enter(const char* what, sigjmp_buf* escape,
                           std::chrono::milliseconds wall_limit) {
  call_name_.store(what, std::memory_order_relaxed);
  call_wall_limit_ms_.store(wall_limit.count(), std::memory_order_relaxed);
  clockid_t clock = CLOCK_THREAD_CPUTIME_ID;
  pthread_getcpuclockid(pthread_self(), &clock);  // arithmetic on the thread id, no system call
  if (t_tid == 0) t_tid = ::gettid();
  caller_.store(pthread_self(), std::memory_order_relaxed);
  caller_tid_.store(t_tid, std::memory_order_relaxed);
  caller_cpu_clock_.store(clock, std::memory_order_relaxed);
  // This call's number before its escape: a late signal for the call before must find the
  // numbers differ, not jump out of this call before it has begun.
  t_doomed = &doomed_call_;
  t_call = calls_.fetch_add(1, std::memory_order_relaxed) + 1;
  std::atomic_signal_fence(std::memory_order_seq_cst);
  t_escape = escape;
  // Publishes the stores above to a watchdog that reads in_call_ first.
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
  const Reason reason = reason_.load(std::memory_order_acquire);
  const std::string call = abandoned_call_name_.load(std::memory_order_relaxed);
  const std::string named = call.empty() ? call : call + " ";
  switch (reason) {
    case Reason::kSpinning:
      return named + "spun for " + std::to_string(cpu_limit_.count()) + " ms of CPU time";
    case Reason::kOverran:
      return named + "ran for " + std::to_string(abandoned_wall_limit_ms_.load()) + " ms";
    case Reason::kNone:
      break;
  }
  return named + "was abandoned";
}

void StuckCallGuard::watch() {
  // Five samples per limit, and at least five a second for the per-call wall limits of a second.
  const auto period = std::clamp(std::min(cpu_limit_, wall_limit_) / 5,
                                 std::chrono::milliseconds(20), std::chrono::milliseconds(200));
  unsigned long seen_calls = 0;
  clockid_t seen_clock{};
  auto wall_at_sight = std::chrono::steady_clock::now();
  std::chrono::nanoseconds cpu_at_sight{0};
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_cv_.wait_for(lock, period, [this] { return stopping_; })) {
    const auto now = std::chrono::steady_clock::now();
    // in_call_ first: once it reads true, the count and clock are that call's or a later one's,
    // never an earlier call's (whose thread may have burnt any amount of CPU since).
    const bool in_call = in_call_.load(std::memory_order_acquire);
    const unsigned long calls = calls_.load(std::memory_order_relaxed);
    const clockid_t clock = caller_cpu_clock_.load(std::memory_order_relaxed);
    const std::chrono::milliseconds wall_limit(call_wall_limit_ms_.load(std::memory_order_relaxed));
    if (!in_call || calls != seen_calls || clock != seen_clock) {
      // A new call (or none): its limits count from here, up to one period after it began.
      seen_calls = calls;
      seen_clock = clock;
      wall_at_sight = now;
      cpu_at_sight = cpu_time(clock, cpu_at_sight);
      continue;
    }
    const auto cpu_now = cpu_time(clock, cpu_at_sight);
    const Reason reason = judge(cpu_now - cpu_at_sight, now - wall_at_sight, wall_limit);
    if (reason == Reason::kNone) continue;
    abandoned_wall_limit_ms_.store(wall_limit.count(), std::memory_order_relaxed);
    abandoned_call_name_.store(call_name_.load(std::memory_order_relaxed),
                               std::memory_order_relaxed);
    reason_.store(reason, std::memory_order_release);
    doomed_call_.store(calls, std::memory_order_relaxed);
    pthread_kill(caller_.load(std::memory_order_relaxed), escape_signal());
    // Once per limit, should the first signal land outside the call.
    wall_at_sight = now;
    cpu_at_sight = cpu_now;
  }
}

StuckCallGuard::Reason StuckCallGuard::judge(std::chrono::nanoseconds cpu_used,
                                             std::chrono::steady_clock::duration wall_used,
                                             std::chrono::milliseconds wall_limit) {
  const bool overran = wall_used >= wall_limit;
  if (cpu_used >= cpu_limit_ && (overran || !lock_holder_gone_ || lock_holder_gone_())) {
    return Reason::kSpinning;
  }
  // Only a call that sleeps (on a lock no one releases, say) overruns. A runnable one is
  // computing or waiting for a core on a busy host, and may be inside malloc or another libc
  // lock, which a jump out of would leave held for good; the CPU rules judge it.
  if (overran && !runnable(caller_tid_.load(std::memory_order_relaxed))) return Reason::kOverran;
  return Reason::kNone;
}

}  // namespace ddp::detail::fabric
