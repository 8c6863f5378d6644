// What --metrics-port adds to every training step: one live::Writer::add_step (and, every
// --log-every steps, one set_progress) into the file mapped shared; and the read the agent makes
// per worker per scrape. Compare with a step of the MNIST CNN (tens of milliseconds).
//   build/bench/live_metrics_bench --benchmark_repetitions=5
//       --benchmark_enable_random_interleaving=true --benchmark_report_aggregates_only=true
#include <unistd.h>

#include <string>

#include <benchmark/benchmark.h>

#include "ddp/live_metrics.h"

namespace ddp::live {
namespace {

std::string file_path() { return "/tmp/ddp-live-metrics-bench-" + std::to_string(getpid()); }

void add_step(benchmark::State& state) {
  const std::string path = file_path();
  Writer writer(path, 0, 2);
  for (auto _ : state) writer.add_step(0.05, 64, 0.001, 4.8e6);
  unlink(path.c_str());
}
BENCHMARK(add_step);

void set_progress(benchmark::State& state) {
  const std::string path = file_path();
  Writer writer(path, 0, 2);
  std::int64_t step = 0;
  for (auto _ : state) writer.set_progress(++step, 0, 0.5, 0.05, 1000, 0.05);
  unlink(path.c_str());
}
BENCHMARK(set_progress);

// The agent's side: open, map, read under the seqlock, unmap.
void read_file(benchmark::State& state) {
  const std::string path = file_path();
  Writer writer(path, 0, 2);
  writer.set_progress(1, 0, 0.5, 0.05, 1000, 0.05);
  for (auto _ : state) benchmark::DoNotOptimize(read(path));
  unlink(path.c_str());
}
BENCHMARK(read_file);

}  // namespace
}  // namespace ddp::live
BENCHMARK_MAIN();
