#include "supervision/change_timeline.h"

#include <fmt/format.h>

namespace ddprun {
namespace {

std::string since(ChangeTimeline::Clock::time_point from, ChangeTimeline::Clock::time_point to) {
  return fmt::format("+{:.2f} s", std::chrono::duration<double>(to - from).count());
}

}  // namespace

std::string ChangeTimeline::line(bool round_ended) const {
  std::string out = "membership change (" + cause + "): detected, workers " +
                    (in_process ? "regrouped in-process " : "stopped ") + since(detected, stopped);
  if (!agreed) return out + ", no new round agreed";
  out += fmt::format(", agreed {} (round {}: {} nodes, {} ranks)", since(detected, *agreed), round,
                     nodes, world_size);
  if (!started) return out;
  out += (in_process ? ", workers placed " : ", workers started ") + since(detected, *started);
  if (first_step) return out + ", first step " + since(detected, *first_step);
  if (round_ended) {
    out +=
        ", first step not reported (its workers write no live metrics: only trainers built "
        "on the library do)";
  }
  return out;
}

}  // namespace ddprun
