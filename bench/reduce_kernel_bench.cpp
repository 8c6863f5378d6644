// The allreduce's float sum kernel on 512 KiB (one block of a 1 MiB allreduce on 2 ranks), into
// output that either only this core has touched, or another core has just read, as a peer's
// cross-memory-attach copy on shm reads a rank's block just before the rank reduces into it.
// The library's kernel (PREFETCHW a block ahead of the stores) against the same Eigen sum with
// plain stores. Compare within one run, repetitions interleaved:
//   build/bench/reduce_kernel_bench --benchmark_repetitions=5
//       --benchmark_enable_random_interleaving=true --benchmark_report_aggregates_only=true
#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include <benchmark/benchmark.h>
#include <Eigen/Core>

#include "comm/reduce_kernels.h"

namespace ddp::detail {
namespace {

constexpr std::size_t kCount = (512u << 10) / sizeof(float);

void plain_eigen_sum(void* out, const void* a, const void* b, std::size_t n) {
  using Const = Eigen::Map<const Eigen::ArrayXf>;
  const auto count = static_cast<Eigen::Index>(n);
  Eigen::Map<Eigen::ArrayXf>(static_cast<float*>(out), count) =
      Const(static_cast<const float*>(a), count) + Const(static_cast<const float*>(b), count);
}

void pin_to_cpu(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
}

// Copies `data` out on another core whenever asked, and says when it is done.
class PeerReader {
 public:
  explicit PeerReader(const std::vector<float>& data)
      : data_(data), copy_(data.size()), thread_([this] { loop(); }) {}
  ~PeerReader() {
    request_.store(kStop);
    thread_.join();
  }
  void read_now() {
    const long ticket = ++issued_;
    request_.store(ticket, std::memory_order_release);
    while (done_.load(std::memory_order_acquire) != ticket) {
    }
  }

 private:
  static constexpr long kStop = -1;
  void loop() {
    pin_to_cpu(1);
    long seen = 0;
    for (;;) {
      const long ticket = request_.load(std::memory_order_acquire);
      if (ticket == kStop) return;
      if (ticket == seen) continue;
      std::memcpy(copy_.data(), data_.data(), data_.size() * sizeof(float));
      benchmark::ClobberMemory();
      seen = ticket;
      done_.store(ticket, std::memory_order_release);
    }
  }
  const std::vector<float>& data_;
  std::vector<float> copy_;
  long issued_ = 0;
  std::atomic<long> request_{0};
  std::atomic<long> done_{0};
  std::thread thread_;
};

void sum_into(benchmark::State& state, ReduceFn kernel, bool peer_reads_output) {
  if (std::thread::hardware_concurrency() < 2) return state.SkipWithError("needs two CPUs");
  pin_to_cpu(0);
  std::vector<float> out(kCount, 1.0f), in(kCount, 2.0f);
  PeerReader peer(out);
  for (auto _ : state) {
    if (peer_reads_output) peer.read_now();
    const auto start = std::chrono::steady_clock::now();
    kernel(out.data(), out.data(), in.data(), kCount);
    benchmark::ClobberMemory();
    state.SetIterationTime(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * kCount * sizeof(float)));
}

void register_all() {
  const ReduceFn library = reduce_kernel(DataType::kFloat32, ReduceOp::kSum);
  for (const bool peer_reads : {false, true}) {
    const char* where = peer_reads ? "/output_just_read_by_another_core" : "/output_private";
    benchmark::RegisterBenchmark((std::string("ddp_sum_kernel") + where).c_str(),
                                 [=](benchmark::State& s) { sum_into(s, library, peer_reads); })
        ->UseManualTime()
        ->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark(
        (std::string("plain_eigen_sum") + where).c_str(),
        [=](benchmark::State& s) { sum_into(s, plain_eigen_sum, peer_reads); })
        ->UseManualTime()
        ->Unit(benchmark::kMicrosecond);
  }
}

}  // namespace
}  // namespace ddp::detail

int main(int argc, char** argv) {
  ddp::detail::register_all();
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
