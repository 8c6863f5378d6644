#pragma once
// Which rank holds the others up: every rank measures its compute time per step (forward,
// backward and optimizer, its waits for other ranks excluded) and its wait time in collectives;
// every `window` steps the ranks share these in one allgather and rank 0 names each rank whose
// compute exceeds the median rank's by the threshold. A slow rank makes every other rank wait in
// the gradients' allreduce, so the job runs at the straggler's speed: the wait times show what
// it costs, the compute times who it is.
#include <cstdint>
#include <string>
#include <vector>

namespace ddp {
class Communicator;
}

namespace ddp::train::detail {

struct Straggler {
  int rank = 0;
  double compute_ms = 0;  // per step, over the window
  double ratio = 0;       // compute_ms / the median rank's
};

// The median of `values` (the mean of the middle two for an even count); 0 for none.
double median(std::vector<double> values);

// The ranks (indices of `compute_ms`) whose compute exceeds `threshold` times the median, the
// slowest first. None when the median is 0.
std::vector<Straggler> find_stragglers(const std::vector<double>& compute_ms, double threshold);

// One window's figures, the same on every rank.
struct StragglerReport {
  int64_t steps = 0;               // in the window
  std::vector<double> compute_ms;  // per rank, per step
  std::vector<double> wait_ms;     // per rank, per step
  double median_compute_ms = 0;
  std::vector<Straggler> stragglers;
};

// "rank 3 (node 1) computes 1.45x slower than the median (61.0 vs 42.0 ms/step over 200 steps)";
// without "(node N)" when `node` is negative (unknown).
std::string describe(const Straggler& straggler, int node, double median_ms, int64_t steps);

class StragglerMonitor {
 public:
  // `window` steps between reports (0: never); `threshold` > 1.
  StragglerMonitor(int64_t window, double threshold) : window_(window), threshold_(threshold) {}

  int64_t window() const { return window_; }
  double threshold() const { return threshold_; }
  // One step of this rank: its compute and its waits for other ranks, in seconds.
  void add_step(double compute_seconds, double wait_seconds);
  // Whether the window is full. Every rank counts the same steps, so all agree.
  bool due() const { return window_ > 0 && steps_ >= window_; }
  // Collective: shares the window's figures (one allgather), then starts the next window.
  StragglerReport share(Communicator& comm);

 private:
  int64_t window_;
  double threshold_;
  int64_t steps_ = 0;
  double compute_seconds_ = 0;
  double wait_seconds_ = 0;
};

}  // namespace ddp::train::detail
