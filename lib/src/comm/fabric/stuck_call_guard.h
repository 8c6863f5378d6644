#pragma once
// A bound on how long one libfabric call may run. libfabric 1.17's shm provider takes spinlocks
// inside the peers' shared-memory regions; a rank killed while holding one leaves it held, and
// every later call that needs it (a send to that rank, or this rank's own progress if the dead
// rank was sending to it) spins forever, beyond the reach of any timeout.
//
// Calls run through run(). A watchdog thread samples the calling thread a few times a second.
// A call is stuck once
//  - it has burnt `cpu_limit` of its thread's CPU time while `lock_holder_gone` says the lock it
//    may spin on will never be released (for shm: a peer on this host has exited), or
//  - it has burnt `cpu_limit` and run past `wall_limit` (a spin that outlives the op's timeout),
//  - or it has slept in the kernel past `wall_limit` (a wait on such a lock, or anything else
//    that outlives the op's timeout).
// CPU time alone misjudges a busy provider: under a loaded CI run a tcp;ofi_rxm call in a 3-rank
// barrier, every peer alive, was charged a whole second of CPU time and was abandoned (a
// thread's CPU clock also counts softirq work done while it was current, and on a VM time the
// host took the vCPU away). Wall time alone misjudges an oversubscribed host: with 24 processes on
// 2 cores, one tcp;ofi_rxm call of a 64 MiB allreduce ran for over a second while using 0.19 s of
// CPU. So a call that is runnable at its wall limit (computing, or ready and waiting for a core) is
// left to the CPU rules: it may be inside malloc, whose lock a jump would leave held, and the next
// allocation would wait forever. The watchdog signals a stuck call's thread, whose handler jumps
// back out of the provider to run(), which reports false.
// The endpoint that call used is in an unknown state from then on and must never be used or
// closed again, only leaked.
// A forked child must not destroy its copy of a guard (the watchdog lives in the parent).
#include <pthread.h>
#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <csetjmp>
#include <ctime>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

namespace ddp::detail::fabric {

class StuckCallGuard {
 public:
  // `lock_holder_gone` runs on the watchdog thread, and only once a call has burnt `cpu_limit`;
  // without one, every call that burns `cpu_limit` is stuck.
  StuckCallGuard(std::chrono::milliseconds cpu_limit, std::chrono::milliseconds wall_limit,
                 std::function<bool()> lock_holder_gone = {});
  ~StuckCallGuard();
  StuckCallGuard(const StuckCallGuard&) = delete;
  StuckCallGuard& operator=(const StuckCallGuard&) = delete;

  // Runs `call` (plain C calls only: frames between here and the provider are discarded, so no
  // object with a destructor may live in them), named `what` (a string literal, "fi_cq_read") in
  // the reason it was abandoned. False if the call was abandoned.
  template <typename Call>
  bool run(const char* what, Call&& call) {
    return run(what, std::forward<Call>(call), wall_limit_);
  }
  // The same with a wall limit of its own for this call: best-effort calls on a failure path
  // (abort notices, closing) give up long before the op's timeout would.
  template <typename Call>
  bool run(const char* what, Call&& call, std::chrono::milliseconds wall_limit) {
    sigjmp_buf escape;
    if (sigsetjmp(escape, 0) != 0) return abandoned();
    enter(what, &escape, wall_limit);
    call();
    leave();
    return true;
  }

  // Which call was abandoned and which limit it reached, for the error message: "fi_cq_read spun
  // for 1000 ms of CPU time" or "fi_tsend ran for 30000 ms".
  std::string last_abandoned_reason() const;

  // The real-time signal that abandons a call (nothing else in the process is expected to use it).
  static int escape_signal();

 private:
  enum class Reason { kNone, kSpinning, kOverran };

  void enter(const char* what, sigjmp_buf* escape, std::chrono::milliseconds wall_limit);
  void leave();
  bool abandoned();
  void watch();
  // Why the watchdog's current call is stuck, if it is, from what it has used since it was seen.
  Reason judge(std::chrono::nanoseconds cpu_used, std::chrono::steady_clock::duration wall_used,
               std::chrono::milliseconds wall_limit);

  std::chrono::milliseconds cpu_limit_;
  std::chrono::milliseconds wall_limit_;
  std::function<bool()> lock_holder_gone_;
  std::atomic<const char*> call_name_{""};  // the current call's
  std::atomic<const char*> abandoned_call_name_{""};
  std::atomic<std::chrono::milliseconds::rep> call_wall_limit_ms_{0};  // the current call's
  std::atomic<std::chrono::milliseconds::rep> abandoned_wall_limit_ms_{0};
  std::atomic<Reason> reason_{Reason::kNone};
  std::atomic<pthread_t> caller_{};
  std::atomic<pid_t> caller_tid_{0};
  std::atomic<clockid_t> caller_cpu_clock_{};
  std::atomic<bool> in_call_{false};
  std::atomic<unsigned long> calls_{0};
  std::atomic<unsigned long> doomed_call_{0};  // the call the watchdog signals to abandon
  std::mutex mutex_;
  std::condition_variable stop_cv_;
  bool stopping_ = false;
  std::thread watchdog_;
};

}  // namespace ddp::detail::fabric
