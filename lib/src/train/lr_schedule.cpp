#include "ddp/train/lr_schedule.h"

#include <algorithm>
#include <cmath>

#include "ddp/error.h"

namespace ddp::train {

LrSchedule::LrSchedule(double base_lr, int64_t total_steps, int64_t steps_per_epoch,
                       LrScheduleOptions options)
    : base_(base_lr),
      total_(std::max<int64_t>(total_steps, 1)),
      per_epoch_(std::max<int64_t>(steps_per_epoch, 1)),
      options_(std::move(options)) {
  if (options_.name != "constant" && options_.name != "step" && options_.name != "cosine") {
    throw ConfigError("unknown learning-rate schedule '" + options_.name +
                      "'; choose constant, step or cosine");
  }
  if (options_.warmup_steps < 0) throw ConfigError("warm-up steps must not be negative");
  if (options_.name == "step" && options_.step_epochs < 1) {
    throw ConfigError("step schedule needs step epochs >= 1");
  }
}

double LrSchedule::at(int64_t step) const {
  const int64_t warmup = options_.warmup_steps;
  if (step < warmup) return base_ * static_cast<double>(step + 1) / static_cast<double>(warmup);
  if (options_.name == "step") {
    return base_ * std::pow(options_.step_gamma,
                            static_cast<double>(step / per_epoch_ / options_.step_epochs));
  }
  if (options_.name == "cosine") {
    const double span = static_cast<double>(std::max<int64_t>(total_ - warmup, 1));
    const double t = std::clamp(static_cast<double>(step - warmup) / span, 0.0, 1.0);
    const double floor = base_ * options_.final_fraction;
    return floor + (base_ - floor) * 0.5 * (1.0 + std::cos(M_PI * t));
  }
  return base_;
}

}  // namespace ddp::train
