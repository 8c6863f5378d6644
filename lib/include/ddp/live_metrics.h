#pragma once
// Live metrics: a worker's training figures in a small file it maps shared
// (DDP_LIVE_METRICS_FILE, set per worker by `ddprun --metrics-port`), read by the agent on the
// node whenever Prometheus scrapes it. Writing is a handful of relaxed atomic stores under a
// seqlock: no system call, no lock, nothing the training thread waits on. Without the variable,
// a writer does nothing.
//
// One writer (the training thread), any number of readers in other processes. Torch-free
// (ddp::base), so ddprun reads what the trainer wrote.
#include <cstdint>
#include <optional>
#include <string>

namespace ddp::live {

// What a reader sees.
struct Snapshot {
  int rank = -1;
  int world_size = 0;
  int pid = 0;
  // Counters since the worker started.
  std::uint64_t steps = 0;
  std::uint64_t images = 0;                 // images this rank trained on
  double step_seconds_total = 0;            // wall time of those steps
  double allreduce_wait_seconds_total = 0;  // the part of it spent waiting for allreduces
  double allreduce_bytes_total = 0;         // gradient bytes this rank allreduced
  // Gauges, as of the last progress record (the trainer's log line; the metrics JSONL's "step").
  std::int64_t step = -1;  // global step; -1 before the first record
  std::int64_t epoch = 0;  // 0-based, as the JSONL's "step" records say
  double loss = 0;
  double learning_rate = 0;
  double images_per_second = 0;  // this rank's, over the log window
  double step_seconds = 0;       // mean over the log window
  // This rank's compute time over the median rank's in the last straggler window; 0: none yet.
  double straggler_ratio = 0;
};

class Writer {
 public:
  Writer() = default;  // records nothing
  // Maps `path` (creating it); throws ddp::DataError naming the file when that fails.
  Writer(const std::string& path, int rank, int world_size);
  // From DDP_LIVE_METRICS_FILE; a writer that records nothing when it is unset.
  static Writer from_environment(int rank, int world_size);
  ~Writer();
  Writer(Writer&& other) noexcept;
  Writer& operator=(Writer&& other) noexcept;
  Writer(const Writer&) = delete;
  Writer& operator=(const Writer&) = delete;

  bool enabled() const { return block_ != nullptr; }
  // One training step: its wall time, the images this rank trained on, the time it waited for
  // allreduces and the bytes it allreduced.
  void add_step(double seconds, std::uint64_t images, double allreduce_wait_seconds,
                double allreduce_bytes);
  void set_progress(std::int64_t step, std::int64_t epoch, double loss, double learning_rate,
                    double images_per_second, double step_seconds);
  void set_straggler_ratio(double ratio);

  struct Block;  // the file's layout (live_metrics.cpp)

 private:
  Block* block_ = nullptr;
};

// Reads the file a Writer maps; nullopt if it is missing, short, not one, or being rewritten
// by a writer that did not finish (a reader retries a torn read a few times first).
std::optional<Snapshot> read(const std::string& path);

}  // namespace ddp::live
