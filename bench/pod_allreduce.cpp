// One rank of the simulated-pod allreduce benchmark (bench/simulated_pods): joins the job from
// torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT; DDP_BACKEND and
// DDP_COLLECTIVES pick the variant), then allreduces float32 buffers of each size given, and rank
// 0 prints one line per size:
//   size_bytes median_us algbw_GBps busbw_GBps link_bytes_per_op
// The median is over `iterations` ops, each timed from a barrier to its end on rank 0.
// link_bytes_per_op is what this rank's node sent on DDP_BENCH_LINK (its pod's interface, e.g.
// eth0) per op: /sys/class/net/IFACE/statistics/tx_bytes around the timed ops, divided by their
// number (barriers included, a few hundred bytes each).
//   pod_allreduce SIZE_BYTES... [--iterations=N] [--min-seconds=S]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "ddp/distributed.h"

namespace {

long long tx_bytes(const char* iface) {
  if (iface == nullptr) return 0;
  std::ifstream in(std::string("/sys/class/net/") + iface + "/statistics/tx_bytes");
  long long value = 0;
  in >> value;
  return value;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::size_t> sizes;
  int iterations = 20;
  double min_seconds = 1.0;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--iterations=", 13) == 0) {
      iterations = std::atoi(argv[i] + 13);
    } else if (std::strncmp(argv[i], "--min-seconds=", 14) == 0) {
      min_seconds = std::atof(argv[i] + 14);
    } else {
      sizes.push_back(std::strtoull(argv[i], nullptr, 10));
    }
  }
  auto group = ddp::init_process_group();
  auto& comm = *group.comm;
  const int world = comm.size();
  const char* link = std::getenv("DDP_BENCH_LINK");
  if (comm.rank() == 0) {
    std::printf("# %s, %s, collectives %s\n", comm.backend_name(),
                comm.topology().describe().c_str(), comm.hierarchical() ? "hierarchical" : "flat");
    std::fflush(stdout);
  }
  for (std::size_t bytes : sizes) {
    std::vector<float> data(bytes / sizeof(float), 1.0f);
    comm.allreduce(data);  // warm-up: connections, registrations, caches
    comm.allreduce(data);
    // As many ops as fit min_seconds, at least `iterations` (every rank the same count: rank 0's
    // estimate is broadcast).
    comm.barrier();
    auto start = std::chrono::steady_clock::now();
    comm.allreduce(data);
    const double one =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::vector<float> count{static_cast<float>(
        std::clamp(static_cast<int>(min_seconds / std::max(one, 1e-6)), iterations, 2000))};
    comm.broadcast(count, 0);
    const int ops = static_cast<int>(count[0]);
    std::vector<double> times;
    const long long sent_before = tx_bytes(link);
    for (int i = 0; i < ops; ++i) {
      comm.barrier();
      start = std::chrono::steady_clock::now();
      comm.allreduce(data);
      times.push_back(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    const long long sent = tx_bytes(link) - sent_before;
    std::sort(times.begin(), times.end());
    const double median = times[times.size() / 2];
    const double algbw = static_cast<double>(bytes) / median / 1e9;
    const double busbw = algbw * 2.0 * (world - 1) / world;
    if (comm.rank() == 0) {
      std::printf("%zu %.1f %.4f %.4f %lld\n", bytes, median * 1e6, algbw, busbw,
                  link ? sent / ops : -1LL);
      std::fflush(stdout);
    }
  }
  comm.barrier();
  return 0;
}
