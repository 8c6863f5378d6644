#pragma once
// Learning rate as a function of the global step: optional linear warm-up, then constant, step
// decay (x gamma every N epochs) or cosine annealing to a floor. A pure function of the step, so
// a resumed run continues the schedule exactly.
#include <cstdint>
#include <string>

namespace ddp::train {

struct LrScheduleOptions {
  std::string name = "cosine";  // "constant", "step" or "cosine"
  int64_t warmup_steps = 0;
  double step_gamma = 0.1;      // "step": multiply by this ...
  int64_t step_epochs = 30;     // ... every this many epochs
  double final_fraction = 0.0;  // "cosine": end at base_lr * final_fraction
};

class LrSchedule {
 public:
  // Throws ConfigError for an unknown name or invalid values.
  LrSchedule(double base_lr, int64_t total_steps, int64_t steps_per_epoch,
             LrScheduleOptions options);
  double at(int64_t step) const;

 private:
  double base_;
  int64_t total_;
  int64_t per_epoch_;
  LrScheduleOptions options_;
};

}  // namespace ddp::train
