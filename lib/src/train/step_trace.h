#pragma once
// The timeline of a few training steps (--trace-steps A:B): what each rank's training thread did
// (data wait, forward, backward, optimizer step, checkpoint) and what its communicator ran
// meanwhile (each bucket's allreduce, from the flight recorder, stamped precisely while tracing),
// as a Chrome trace-event JSON file per rank that Perfetto and chrome://tracing open. Times are
// the wall clock (microseconds since the epoch), so that ranks on different nodes line up; pid is
// the rank, tid 0 the training thread, tid 1 the collectives. ddprun merges the ranks' files into
// one (launcher/diagnosis/trace_merge.h).
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ddp/flight_recorder.h"

namespace ddp {
class Communicator;
}

namespace ddp::train::detail {

struct StepRange {
  int64_t first = 0;  // steps are numbered from 1
  int64_t last = 0;
};

// "A:B" (1 <= A <= B) or "A" (one step); ConfigError naming the text otherwise.
StepRange parse_step_range(const std::string& text);

class StepTrace {
 public:
  using Clock = std::chrono::steady_clock;

  // Nothing is traced without `range`. `path`: the file written once the last step is traced.
  StepTrace(std::optional<StepRange> range, std::string path, int rank, int node);

  bool enabled() const { return range_.has_value(); }
  const std::string& path() const { return path_; }
  // Whether `step` (numbered from 1) is traced.
  bool traces(int64_t step) const {
    return range_ && step >= range_->first && step <= range_->last;
  }

  // Brackets a traced step: turns the communicator's precise op stamps on (off after the range's
  // last step), and at the end adds the collectives that ran during the step, from its flight
  // recorder.
  void begin_step(Communicator& comm, int64_t step);
  void end_step(Communicator& comm, int64_t step);
  // Writes the file once `step` reached the range's last step (after that step's checkpoint, if
  // any); once.
  void write_after(int64_t step);
  int64_t last_step() const { return range_ ? range_->last : 0; }

  // A span of the training thread (name: a literal), with the step it belongs to.
  void span(const char* name, Clock::time_point start, Clock::time_point end, int64_t step);
  // Collectives of `snapshot` begun after seq `after` (the ones of this step).
  void add_collectives(const flight::Snapshot& snapshot, std::uint64_t after, int64_t step);

  // The Chrome trace JSON of what was recorded so far.
  std::string json() const;
  void write() const;

 private:
  struct Event {
    std::string name;
    int tid;
    double ts_us;
    double dur_us;
    int64_t step;
    std::string detail;  // args.op, for collectives
  };
  double wall_us(std::int64_t monotonic_ns) const;

  std::optional<StepRange> range_;
  std::string path_;
  int rank_;
  int node_;
  std::int64_t wall_minus_monotonic_ns_ = 0;
  std::uint64_t ops_before_step_ = 0;
  std::vector<Event> events_;
  bool written_ = false;
};

}  // namespace ddp::train::detail
