// Process facts the trainer reports (lib/src/train/resource_usage.cpp): peak resident memory,
// the process's age, and the allocator settings that keep large freed blocks for reuse.
#include "ddp/train/resource_usage.h"

#include <malloc.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <new>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace ddp::train {
namespace {

TEST(ResourceUsage, PeakRssCountsMemoryThisProcessTouched) {
  const double before = peak_rss_mib();
  ASSERT_GT(before, 0.0);
  constexpr std::size_t kBytes = std::size_t{96} << 20;
  std::vector<char> block(kBytes);
  std::memset(block.data(), 1, block.size());  // resident only once written
  const double after = peak_rss_mib();
  // Never less than the block on top of what was resident when it was taken (the peak may have
  // been higher before, so compare against what is resident at least now).
  EXPECT_GE(after, 96.0) << "before " << before;
  EXPECT_EQ(block[kBytes - 1], 1);
}

TEST(ResourceUsage, ProcessAgeIsBetweenZeroAndTheMachinesUptimeAndGrows) {
  const double age = seconds_since_process_start();
  ASSERT_GE(age, 0.0);
  double uptime = 0;
  std::ifstream("/proc/uptime") >> uptime;
  ASSERT_GT(uptime, 0.0);
  EXPECT_LE(age, uptime + 0.02);  // one clock tick of slack (10 ms at USER_HZ 100)
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const double later = seconds_since_process_start();
  EXPECT_GE(later - age, 0.09);
}

TEST(ResourceUsage, LargeBlocksComeFromTheHeapOnceFreedMemoryIsKept) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "the sanitizer's allocator replaces glibc malloc, whose settings this checks";
#endif
  constexpr std::size_t kBytes = std::size_t{16} << 20;
  const auto mmapped_by_a_block = [&] {
    const std::size_t before = mallinfo2().hblkhd;
    void* block = std::malloc(kBytes);
    if (!block) throw std::bad_alloc();
    std::memset(block, 0, kBytes);
    const std::size_t during = mallinfo2().hblkhd;
    std::free(block);
    return during - before;
  };
  // glibc's default: a block this large is mmapped (and unmapped again when freed).
  ASSERT_EQ(mallopt(M_MMAP_THRESHOLD, 128 << 10), 1);
  EXPECT_GE(mmapped_by_a_block(), kBytes);
  // Kept: it comes from the heap, below the 32 MiB threshold this sets.
  keep_freed_memory_for_reuse();
  EXPECT_EQ(mmapped_by_a_block(), 0u);
}

}  // namespace
}  // namespace ddp::train
