// What the flight recorder adds to every collective, on one core: begin + the algorithm's note +
// two waits' notes + end, as one op records them, into private memory and into a file mapped
// shared (as under ddprun); and the reader the agent runs every second. Compare with a 4 KiB
// allreduce's time (allreduce_bench --interleave='^(ddp_gloo|ddp_gloo_unrecorded)$').
//   build/bench/flight_recorder_bench --benchmark_repetitions=5
//       --benchmark_enable_random_interleaving=true --benchmark_report_aggregates_only=true
#include <unistd.h>

#include <string>

#include <benchmark/benchmark.h>

#include "ddp/flight_recorder.h"

namespace ddp::flight {
namespace {

std::string file_path() { return "/tmp/ddp-flight-recorder-bench-" + std::to_string(getpid()); }

void record_op(benchmark::State& state, bool in_file) {
  const std::string path = in_file ? file_path() : "";
  Recorder recorder(256, path, 0, 2);
  const OpLabel label("bucket", 3);
  const Recorder::Op op{OpKind::kAllreduce, name_code("float32"), 1024, 4096, OpLabel::current()};
  for (auto _ : state) {
    const auto seq = recorder.begin(op);
    Recorder::note_algorithm(name_code("direct"));
    Recorder::note_waiting_on(1);
    Recorder::note_waiting_on(1);
    recorder.end(seq, true);
  }
  if (in_file) unlink(path.c_str());
}
BENCHMARK_CAPTURE(record_op, private_memory, false);
BENCHMARK_CAPTURE(record_op, shared_file, true);

// Off (DDP_FLIGHT_RECORDER_ENTRIES=0): the calls a communicator still makes.
void record_op_off(benchmark::State& state) {
  Recorder recorder(0, "", 0, 2);
  const Recorder::Op op{OpKind::kAllreduce, name_code("float32"), 1024, 4096, {}};
  for (auto _ : state) {
    const auto seq = recorder.begin(op);
    Recorder::note_waiting_on(1);
    recorder.end(seq, true);
  }
}
BENCHMARK(record_op_off);

// The agent's read of one worker's ring (256 ops), once a second per worker.
void read_ring(benchmark::State& state) {
  const std::string path = file_path();
  Recorder recorder(256, path, 0, 2);
  for (int i = 0; i < 300; ++i)
    recorder.end(recorder.begin({OpKind::kAllreduce, 0, 1, 4, {}}), true);
  for (auto _ : state) benchmark::DoNotOptimize(read_file(path));
  unlink(path.c_str());
}
BENCHMARK(read_ring)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace ddp::flight

BENCHMARK_MAIN();
