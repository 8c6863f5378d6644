#pragma once
// A barrier for the benchmark's forked ranks through one cache line of shared memory: it lines
// the ranks up before a timed op without running any of the code under test, so an op measured
// cold (allreduce_bench --evict-bytes, --idle-us) finds that code as cold as it was left, and no
// rank's op absorbs another rank's late start.
#include <sched.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "shared_atomic.h"

namespace ddp::bench {

class SharedBarrier {
 public:
  // Call before fork(): the counter lives in memory shared with the children.
  static SharedBarrier create(int ranks) {
    return SharedBarrier(new_shared_atomic<std::uint64_t>(0, "shared barrier"), ranks);
  }

  // Every rank calls it the same number of times; each call returns once all ranks made it.
  // A rank that never arrives (it died) ends the benchmark after a minute instead of hanging it.
  void arrive_and_wait() {
    ++generation_;
    arrived_->fetch_add(1, std::memory_order_acq_rel);
    const std::uint64_t everyone = generation_ * static_cast<std::uint64_t>(ranks_);
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::minutes(1);
    for (unsigned long spins = 1; arrived_->load(std::memory_order_acquire) < everyone; ++spins) {
      // More ranks than cores: let the ones still on their way run.
      if (spins > kSpinsBeforeYield) sched_yield();
      if (spins % kSpinsBeforeYield == 0 && std::chrono::steady_clock::now() > give_up) {
        std::fprintf(stderr,
                     "allreduce_bench: a rank did not reach the start of an op within "
                     "a minute; it has died or hangs\n");
        std::exit(1);
      }
    }
  }

 private:
  static constexpr unsigned long kSpinsBeforeYield = 1ul << 16;
  SharedBarrier(std::atomic<std::uint64_t>* arrived, int ranks)
      : arrived_(arrived), ranks_(ranks) {}
  std::atomic<std::uint64_t>* arrived_;
  int ranks_;
  std::uint64_t generation_ = 0;  // this rank's calls so far
};

}  // namespace ddp::bench
