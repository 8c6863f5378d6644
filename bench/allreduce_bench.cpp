// Allreduce bandwidth and latency, 4 KiB to 64 MiB, ddp's backends side by side with raw gloo
// and libtorch's ProcessGroupGloo. Ranks are forked processes on this host; every variant runs
// at every size before the next size starts, so a change of host placement during the run hits
// all variants alike. Reports the median per-op time and nccl-tests' algbw/busbw
// (busbw = algbw * 2(n-1)/n).
//   allreduce_bench [--ranks=N] [--interleave=REGEX] [--cpu-hogs=N] [--rewrite-buffer]
//                   [--evict-bytes=N] [--idle-us=N] [google benchmark flags]
// --interleave runs only the variants whose names match REGEX, all of them once per iteration
// in shuffled order: the way to compare variants whose differences are smaller than this
// machine's drift between benchmarks (see register_interleaved). bench/interleaved_table
// summarises several such runs. --cpu-hogs=N runs N busy loops beside the ranks for the whole
// run, the way training compute or a noisy neighbour competes with a collective for the cores.
// --rewrite-buffer writes the buffer before each op (outside the timing), as autograd rewrites
// a DDP bucket between its allreduces: a buffer allreduced over and over is partly in the peer's
// cache, which a rank's writes into it must first take back.
// --evict-bytes=N writes N bytes of other memory before each op, and --idle-us=N sleeps that long
// (both outside the timing): the two ways a DDP step separates its allreduces, backward's compute
// pushing the collective's code and data out of the caches and the communication thread waiting
// for the next bucket. Ops measured so start cold, as in training; back to back they do not.
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <optional>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>

#include "allreduce_variants.h"
#include "ddp/comm/factory.h"
#include "fabric_variants.h"
#include "placement_probe.h"
#include "shared_barrier.h"
#include "tcp_socket_exchange.h"

namespace ddp::bench {
namespace {

using Clock = std::chrono::steady_clock;

// What happens between two timed ops (the flags above); set before the ranks fork.
struct BetweenOps {
  bool rewrite_buffer = false;
  std::size_t evict_bytes = 0;
  int idle_us = 0;
  bool any() const { return rewrite_buffer || evict_bytes > 0 || idle_us > 0; }
  bool cold() const { return evict_bytes > 0 || idle_us > 0; }
};
BetweenOps between_ops;
// Lines the ranks up after evicting or idling: those take each rank a different time.
SharedBarrier* cold_start = nullptr;

void before_op(float* data, std::size_t count) {
  if (between_ops.rewrite_buffer) std::fill_n(data, count, 1.0f);
  if (between_ops.evict_bytes > 0) {
    static std::vector<char> other(between_ops.evict_bytes);
    static unsigned char round = 0;
    std::memset(other.data(), ++round, other.size());
    benchmark::ClobberMemory();
  }
  if (between_ops.idle_us > 0) usleep(static_cast<useconds_t>(between_ops.idle_us));
  if (cold_start) cold_start->arrive_and_wait();
}

constexpr std::size_t kSizes[] = {4u << 10, 16u << 10, 64u << 10, 256u << 10,
                                  1u << 20, 4u << 20,  16u << 20, 64u << 20};

// A local memcpy of the same bytes: the memory-bandwidth ceiling for any on-host allreduce.
class MemcpyCeiling final : public AllreduceVariant {
 public:
  void prepare(float* data, std::size_t count) override {
    src_ = data;
    dst_.resize(count);
  }
  void run() override {
    std::memcpy(dst_.data(), src_, dst_.size() * sizeof(float));
    benchmark::ClobberMemory();
  }

 private:
  const float* src_ = nullptr;
  std::vector<float> dst_;
};

std::vector<VariantFactory> all_variants(int world) {
  std::vector<VariantFactory> v;
  v.push_back({"memcpy_ceiling", [](auto, int, int) {
                 return std::unique_ptr<AllreduceVariant>(new MemcpyCeiling());
               }});
  if (world == 2) v.push_back(tcp_socket_exchange_variant());
  v.push_back(ddp_variant("ddp_gloo", "gloo"));
  v.push_back(ddp_variant("ddp_gloo_ring", "gloo", {{"DDP_ALGORITHM", "ring"}}));
  // gloo without one-round collectives: the ring from the first byte.
  v.push_back(ddp_variant("ddp_gloo_no_rounds", "gloo", {{"DDP_DIRECT_BYTES", "0"}}));
  v.push_back(ddp_variant("ddp_gloo_avg", "gloo", {}, ReduceOp::kAvg));
  v.push_back(ddp_variant("ddp_gloo_bf16", "gloo", {}, ReduceOp::kSum, DataType::kBFloat16));
  // The flight recorder's cost: off, and in a file as under ddprun (ddp_gloo keeps it in memory).
  v.push_back(ddp_variant("ddp_gloo_unrecorded", "gloo", {{"DDP_FLIGHT_RECORDER_ENTRIES", "0"}}));
  v.push_back(ddp_variant("ddp_gloo_recorder_file", "gloo",
                          {{"DDP_FLIGHT_RECORDER_FILE", "/tmp/ddp-bench-flight-recorder.bin"}}));
  const auto backends = available_backends();
  if (std::find(backends.begin(), backends.end(), "fabric") != backends.end()) {
    const std::vector<std::pair<std::string, std::string>> shm{{"DDP_FABRIC_PROVIDER", "shm"}};
    const std::vector<std::pair<std::string, std::string>> tcp{
        {"DDP_FABRIC_PROVIDER", "tcp;ofi_rxm"}};
    v.push_back(ddp_variant("ddp_fabric_shm", "fabric", shm));
    v.push_back(ddp_variant("ddp_fabric_shm_unrecorded", "fabric",
                            {shm[0], {"DDP_FLIGHT_RECORDER_ENTRIES", "0"}}));
    v.push_back(ddp_variant("ddp_fabric_tcp", "fabric", tcp));
    v.push_back(ddp_variant("ddp_fabric_shm_avg", "fabric", shm, ReduceOp::kAvg));
    v.push_back(ddp_variant("ddp_fabric_tcp_avg", "fabric", tcp, ReduceOp::kAvg));
    v.push_back(
        ddp_variant("ddp_fabric_shm_bf16", "fabric", shm, ReduceOp::kSum, DataType::kBFloat16));
  }
  for (auto& f : fabric_variants(world)) v.push_back(std::move(f));
  for (auto& f : raw_gloo_variants()) v.push_back(std::move(f));
  v.push_back(c10d_gloo_variant());
  return v;
}

int iterations_for(std::size_t bytes) {
  // About 128 MiB moved per benchmark, at least 10 and at most 200 operations.
  return static_cast<int>(std::clamp<std::size_t>((128u << 20) / bytes, 10, 200));
}

double median_of(std::vector<double> values) {
  std::nth_element(values.begin(), values.begin() + values.size() / 2, values.end());
  return values[values.size() / 2];
}

// One benchmark per size that runs every chosen variant once per iteration, in a new order each
// time: a change of host placement, or a noisy neighbour, in the middle of the size hits all
// variants alike, and no variant always follows the same one (c10d leaves threads busy after
// its ops), so their medians can be compared directly.
void register_interleaved(const std::vector<VariantFactory>& factories,
                          const std::vector<std::unique_ptr<AllreduceVariant>>& variants,
                          float* data) {
  for (std::size_t bytes : kSizes) {
    const std::string name = "interleaved/" + std::to_string(bytes >> 10) + "KiB";
    benchmark::RegisterBenchmark(
        name.c_str(),
        [=, &factories, &variants](benchmark::State& state) {
          const std::size_t n = variants.size();
          for (auto& variant : variants) variant->prepare(data, bytes / sizeof(float));
          std::vector<std::vector<double>> seconds(n);
          std::vector<std::size_t> order(n);
          std::iota(order.begin(), order.end(), 0);
          // The same seed and the same binary on every rank: every rank draws the same order.
          std::mt19937 shuffler(static_cast<unsigned>(bytes));
          for (auto _ : state) {
            std::shuffle(order.begin(), order.end(), shuffler);
            for (std::size_t i : order) {
              before_op(data, bytes / sizeof(float));
              const auto start = Clock::now();
              variants[i]->run();
              seconds[i].push_back(std::chrono::duration<double>(Clock::now() - start).count());
            }
          }
          for (std::size_t i = 0; i < n; ++i) {
            state.counters[factories[i].name + "_p50_us"] = median_of(seconds[i]) * 1e6;
          }
        })
        ->Iterations(std::max(20, iterations_for(bytes)))
        ->UseRealTime()
        ->Unit(benchmark::kMicrosecond);
  }
}

void run_rank(int rank, int world, std::shared_ptr<Store> store, int argc, char** argv,
              const std::string& interleave) {
  auto factories = all_variants(world);
  if (!interleave.empty()) {
    const std::regex chosen(interleave);
    factories.erase(
        std::remove_if(factories.begin(), factories.end(),
                       [&](const VariantFactory& f) { return !std::regex_search(f.name, chosen); }),
        factories.end());
    if (factories.empty()) {
      if (rank == 0) {
        std::fprintf(stderr, "allreduce_bench: no variant name matches --interleave=%s\n",
                     interleave.c_str());
      }
      std::exit(2);
    }
  }
  std::vector<std::unique_ptr<AllreduceVariant>> variants;
  for (std::size_t i = 0; i < factories.size(); ++i) {
    try {
      variants.push_back(
          factories[i].make(store->with_prefix("variant" + std::to_string(i)), rank, world));
    } catch (const std::exception& e) {
      // One line naming the variant, not std::terminate's backtrace; the other ranks, forked
      // with PR_SET_PDEATHSIG, go with rank 0.
      std::fprintf(stderr, "allreduce_bench: rank %d cannot set up variant %s: %s\n", rank,
                   factories[i].name.c_str(), e.what());
      std::exit(1);
    }
  }
  static std::vector<float> data(kSizes[std::size(kSizes) - 1] / sizeof(float), 1.0f);
  if (!interleave.empty()) {
    register_interleaved(factories, variants, data.data());
    benchmark::Initialize(&argc, argv);
    benchmark::AddCustomContext("ranks", std::to_string(world));
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    return;
  }
  for (std::size_t bytes : kSizes) {
    for (std::size_t i = 0; i < variants.size(); ++i) {
      AllreduceVariant* variant = variants[i].get();
      const std::string name = factories[i].name + "/" + std::to_string(bytes >> 10) + "KiB";
      benchmark::RegisterBenchmark(
          name.c_str(),
          [=](benchmark::State& state) {
            variant->prepare(data.data(), bytes / sizeof(float));
            std::vector<double> seconds;
            seconds.reserve(state.max_iterations);
            for (auto _ : state) {
              if (between_ops.any()) {
                state.PauseTiming();
                before_op(data.data(), bytes / sizeof(float));
                state.ResumeTiming();
              }
              const auto start = Clock::now();
              variant->run();
              seconds.push_back(std::chrono::duration<double>(Clock::now() - start).count());
            }
            std::nth_element(seconds.begin(), seconds.begin() + seconds.size() / 2, seconds.end());
            const double median = seconds[seconds.size() / 2];
            const double algbw = bytes / median / 1e9;
            state.counters["p50_us"] = median * 1e6;
            state.counters["algbw_GBps"] = algbw;
            state.counters["busbw_GBps"] = algbw * 2.0 * (world - 1) / world;
            state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes));
          })
          ->Iterations(iterations_for(bytes))
          ->UseRealTime()
          ->Unit(benchmark::kMicrosecond);
    }
  }
  benchmark::Initialize(&argc, argv);
  benchmark::AddCustomContext("ranks", std::to_string(world));
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
}

// Processes that only burn CPU until killed (or until the benchmark dies: PR_SET_PDEATHSIG).
std::vector<pid_t> start_cpu_hogs(int count) {
  std::vector<pid_t> hogs;
  for (int i = 0; i < count; ++i) {
    const pid_t pid = fork();
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      for (volatile unsigned long spin = 0;; spin = spin + 1) {
      }
    }
    if (pid > 0) hogs.push_back(pid);
  }
  return hogs;
}

void stop(const std::vector<pid_t>& processes) {
  for (pid_t pid : processes) kill(pid, SIGKILL);
  for (pid_t pid : processes) waitpid(pid, nullptr, 0);
}

}  // namespace
}  // namespace ddp::bench

int main(int argc, char** argv) {
  int world = 2;
  int cpu_hogs = 0;
  std::string interleave;
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    if (std::strncmp(argv[i], "--ranks=", 8) == 0) {
      world = std::max(2, std::atoi(argv[i] + 8));
    } else if (std::strncmp(argv[i], "--cpu-hogs=", 11) == 0) {
      cpu_hogs = std::max(0, std::atoi(argv[i] + 11));
    } else if (std::strcmp(argv[i], "--rewrite-buffer") == 0) {
      ddp::bench::between_ops.rewrite_buffer = true;
    } else if (std::strncmp(argv[i], "--evict-bytes=", 14) == 0) {
      const long long bytes = std::atoll(argv[i] + 14);
      if (bytes < 0 || bytes > (1ll << 34)) {
        std::fprintf(stderr, "allreduce_bench: --evict-bytes takes 0 to 16 GiB, got %s\n",
                     argv[i] + 14);
        return 2;
      }
      ddp::bench::between_ops.evict_bytes = static_cast<std::size_t>(bytes);
    } else if (std::strncmp(argv[i], "--idle-us=", 10) == 0) {
      ddp::bench::between_ops.idle_us = std::max(0, std::atoi(argv[i] + 10));
    } else if (std::strncmp(argv[i], "--interleave=", 13) == 0) {
      interleave = argv[i] + 13;
    } else if (std::strstr(argv[i], "random_interleaving")) {
      // Each rank would shuffle its own order, and the ranks' collectives would not match.
      std::fprintf(stderr,
                   "allreduce_bench: --benchmark_enable_random_interleaving would give each rank "
                   "its own order and deadlock; the variants are already interleaved by size\n");
      return 2;
    } else {
      args.push_back(argv[i]);
    }
  }
  int nargs = static_cast<int>(args.size());
  // Measured before any thread exists, so the forked ranks share it.
  auto probe = ddp::bench::PlacementProbe::create();
  std::optional<ddp::bench::SharedBarrier> barrier;
  if (ddp::bench::between_ops.cold()) {
    barrier = ddp::bench::SharedBarrier::create(world);
    ddp::bench::cold_start = &*barrier;
  }
  auto server = ddp::Store::host(0, std::chrono::minutes(5));
  const int port = server->port();
  std::vector<pid_t> children;
  for (int rank = 1; rank < world; ++rank) {
    const pid_t pid = fork();
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (!freopen("/dev/null", "w", stdout)) _exit(1);
      if (rank == 1) probe.respond();
      auto store = ddp::Store::connect("127.0.0.1", port, std::chrono::minutes(5));
      ddp::bench::run_rank(rank, world, store, nargs, args.data(), interleave);
      std::fflush(nullptr);
      _exit(0);
    }
    children.push_back(pid);
  }
  const double rtt_us = probe.measure_round_trip_us();
  std::printf("inter-core round trip: %.2f us (%s placement)\n", rtt_us,
              rtt_us < 1.8 ? "near" : "far");
  benchmark::AddCustomContext("intercore_rtt_us", std::to_string(rtt_us));
  if (cpu_hogs > 0) std::printf("busy loops beside the ranks: %d\n", cpu_hogs);
  benchmark::AddCustomContext("cpu_hogs", std::to_string(cpu_hogs));
  benchmark::AddCustomContext("rewrite_buffer",
                              ddp::bench::between_ops.rewrite_buffer ? "yes" : "no");
  benchmark::AddCustomContext("evict_bytes", std::to_string(ddp::bench::between_ops.evict_bytes));
  benchmark::AddCustomContext("idle_us", std::to_string(ddp::bench::between_ops.idle_us));
  // After the placement probe, which needs both cores to itself.
  const auto hogs = ddp::bench::start_cpu_hogs(cpu_hogs);
  ddp::bench::run_rank(0, world, server, nargs, args.data(), interleave);
  ddp::bench::stop(hogs);
  int failed = 0;
  for (pid_t pid : children) {
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failed;
  }
  return failed == 0 ? 0 : 1;
}
