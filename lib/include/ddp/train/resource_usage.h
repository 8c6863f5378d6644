#pragma once
// Process facts the trainer reports: peak resident memory, and the glibc allocator settings that
// stop a training loop from returning (and re-faulting) its large tensors to the kernel each step.
#include <cstdint>

namespace ddp::train {

// Peak resident set size of this process, in MiB (getrusage).
double peak_rss_mib();

// Seconds since this process started (from /proc/self/stat; 10 ms resolution), or -1.
double seconds_since_process_start();

// glibc malloc: serve large blocks from the heap instead of fresh mmaps and never trim it.
// Training allocates and frees the same few MB-sized tensors every step; with the defaults each
// becomes an mmap/munmap pair plus a page fault per 4 KiB, a large share of a CPU training
// step. Costs a little peak memory, which the heap then keeps.
void keep_freed_memory_for_reuse();

}  // namespace ddp::train
