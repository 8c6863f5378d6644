#pragma once
// The timeline of one membership change (a node lost, left or joined), stated in one log line
// once the new world has made its first step:
//
//   membership change (node 1 (train-1) was lost: ...): detected, workers stopped +1.10 s,
//   agreed +1.21 s (round 2: 2 nodes, 4 ranks), workers started +1.30 s, first step +2.41 s
//
// or, where the workers regrouped in-process (supervision/regroup_offer.h):
//
//   membership change (...): detected, workers regrouped in-process +0.02 s, agreed +0.05 s
//   (round 2: ...), workers placed +0.05 s, first step +0.31 s
//
// Times are from the moment this node's agent learned of the change: a lost node is declared
// after its heartbeat limit, so the line names that too. "First step" is the first training
// step any worker of this node reports in the new round, from the live metrics the library's
// trainer writes (ddp/live_metrics.h); a worker that writes none (a Python script) leaves it
// unknown, and the line says so when the round ends without one. Pure, so it is unit-tested.
#include <chrono>
#include <optional>
#include <string>
#include <utility>

namespace ddprun {

struct ChangeTimeline {
  using Clock = std::chrono::steady_clock;

  ChangeTimeline(std::string cause_, Clock::time_point detected_, Clock::time_point stopped_)
      : cause(std::move(cause_)), detected(detected_), stopped(stopped_) {}

  std::string cause;  // the change's headline
  Clock::time_point detected;
  Clock::time_point stopped;                    // this node's workers had all exited
  std::optional<Clock::time_point> agreed;      // the next round closed
  std::optional<Clock::time_point> started;     // its workers were started
  std::optional<Clock::time_point> first_step;  // one of them reported a step
  int round = -1;                               // the new round
  int nodes = 0;
  int world_size = 0;
  bool in_process = false;  // the workers kept running: stopped means answered, started placed

  // The line; `round_ended`: the new round is over without a step reported.
  std::string line(bool round_ended = false) const;
};

}  // namespace ddprun
