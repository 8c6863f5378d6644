#pragma once
// An atomic in anonymous shared memory, made before fork(): the benchmark's forked ranks all see
// the same one. Never freed; it lives as long as the benchmark.
#include <sys/mman.h>

#include <atomic>
#include <new>
#include <stdexcept>
#include <string>

namespace ddp::bench {

template <typename T>
std::atomic<T>* new_shared_atomic(T initial, const char* what) {
  void* p = mmap(nullptr, sizeof(std::atomic<T>), PROT_READ | PROT_WRITE,
                 MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::runtime_error(std::string(what) + ": mmap failed");
  return new (p) std::atomic<T>(initial);
}

}  // namespace ddp::bench
