#pragma once
// Tells which of its two host placements this VM's cores are in: the round trip of a cache
// line between two processes is ~0.8 us in one and ~3 us in the other, and every on-host
// communication figure moves with it. Benchmarks print it so runs can be compared honestly.
#include <atomic>
#include <chrono>

#include "shared_atomic.h"

namespace ddp::bench {

class PlacementProbe {
 public:
  // Call before fork(): the flag lives in memory shared with the children.
  static PlacementProbe create() {
    return PlacementProbe(new_shared_atomic<int>(0, "placement probe"));
  }

  // In the child: answer every ping until the parent says stop (-1).
  void respond() {
    int seen = 0;
    while (true) {
      int v = flag_->load(std::memory_order_acquire);
      if (v < 0) return;
      if (v != seen && (v & 1) == 1) {
        seen = v + 1;
        flag_->store(seen, std::memory_order_release);
      }
    }
  }

  // In the parent: median-free mean over many pings, in microseconds.
  double measure_round_trip_us(int pings = 20000) {
    using Clock = std::chrono::steady_clock;
    int v = 0;
    // Warm up and let the child start spinning.
    for (int i = 0; i < 1000; ++i) ping(v);
    const auto start = Clock::now();
    for (int i = 0; i < pings; ++i) ping(v);
    const double us = std::chrono::duration<double, std::micro>(Clock::now() - start).count();
    flag_->store(-1, std::memory_order_release);
    return us / pings;
  }

 private:
  explicit PlacementProbe(std::atomic<int>* flag) : flag_(flag) {}
  void ping(int& v) {
    v += 1;
    flag_->store(v, std::memory_order_release);
    while (flag_->load(std::memory_order_acquire) != v + 1) {
    }
    v += 1;
  }
  std::atomic<int>* flag_;
};

}  // namespace ddp::bench
