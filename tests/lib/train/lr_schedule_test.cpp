// Unit test of lib/src/train/lr_schedule.cpp: the linear warm-up, the constant, step and cosine
// schedules as functions of the global step, their edges, and the options they reject.
#include "ddp/train/lr_schedule.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "ddp/error.h"

namespace ddp::train {
namespace {

LrScheduleOptions named(const std::string& name, int64_t warmup = 0) {
  LrScheduleOptions options;
  options.name = name;
  options.warmup_steps = warmup;
  return options;
}

TEST(LrSchedule, TheDefaultIsCosine) {
  const LrSchedule schedule(1.0, 100, 10, LrScheduleOptions{});
  EXPECT_DOUBLE_EQ(schedule.at(0), 1.0);
  EXPECT_DOUBLE_EQ(schedule.at(50), 0.5);
  EXPECT_NEAR(schedule.at(100), 0.0, 1e-15);
}

TEST(LrSchedule, ConstantKeepsTheBaseRate) {
  const LrSchedule schedule(0.25, 100, 10, named("constant"));
  for (int64_t step : {0, 1, 50, 99, 100, 10000}) {
    EXPECT_DOUBLE_EQ(schedule.at(step), 0.25) << "step " << step;
  }
}

TEST(LrSchedule, WarmUpRisesLinearlyToTheBaseRateOnItsLastStep) {
  const LrSchedule schedule(0.8, 100, 10, named("constant", 4));
  EXPECT_DOUBLE_EQ(schedule.at(0), 0.2);
  EXPECT_DOUBLE_EQ(schedule.at(1), 0.4);
  EXPECT_DOUBLE_EQ(schedule.at(2), 0.6);
  EXPECT_DOUBLE_EQ(schedule.at(3), 0.8);
  EXPECT_DOUBLE_EQ(schedule.at(4), 0.8);
}

TEST(LrSchedule, StepMultipliesByGammaEveryStepEpochs) {
  LrScheduleOptions options = named("step");
  options.step_gamma = 0.5;
  options.step_epochs = 2;
  // 10 steps per epoch: the rate halves every 20 steps.
  const LrSchedule schedule(1.0, 1000, 10, options);
  EXPECT_DOUBLE_EQ(schedule.at(0), 1.0);
  EXPECT_DOUBLE_EQ(schedule.at(19), 1.0);
  EXPECT_DOUBLE_EQ(schedule.at(20), 0.5);
  EXPECT_DOUBLE_EQ(schedule.at(39), 0.5);
  EXPECT_DOUBLE_EQ(schedule.at(40), 0.25);
  EXPECT_DOUBLE_EQ(schedule.at(65), 0.125);
}

TEST(LrSchedule, StepDecayCountsEpochsFromTheFirstStepNotFromTheEndOfWarmUp) {
  LrScheduleOptions options = named("step", 5);
  options.step_gamma = 0.1;
  options.step_epochs = 1;
  const LrSchedule schedule(2.0, 1000, 10, options);
  EXPECT_DOUBLE_EQ(schedule.at(0), 0.4);  // warm-up: 2 * 1 / 5
  EXPECT_DOUBLE_EQ(schedule.at(4), 2.0);
  EXPECT_DOUBLE_EQ(schedule.at(5), 2.0);
  EXPECT_DOUBLE_EQ(schedule.at(10), 0.2);  // epoch 1
  EXPECT_DOUBLE_EQ(schedule.at(25), 0.02);
}

TEST(LrSchedule, NoStepsPerEpochCountsAsOne) {
  LrScheduleOptions options = named("step");
  options.step_gamma = 0.5;
  options.step_epochs = 3;
  const LrSchedule schedule(1.0, 100, 0, options);
  EXPECT_DOUBLE_EQ(schedule.at(2), 1.0);
  EXPECT_DOUBLE_EQ(schedule.at(3), 0.5);
  EXPECT_DOUBLE_EQ(schedule.at(6), 0.25);
}

TEST(LrSchedule, CosineAnnealsFromTheBaseRateToTheFloor) {
  LrScheduleOptions options = named("cosine");
  options.final_fraction = 0.1;
  const LrSchedule schedule(2.0, 100, 10, options);
  // floor 0.2; lr = 0.2 + 1.8 * (1 + cos(pi t)) / 2 at t = step / 100.
  EXPECT_DOUBLE_EQ(schedule.at(0), 2.0);
  EXPECT_DOUBLE_EQ(schedule.at(25), 0.2 + 0.9 * (1.0 + std::sqrt(0.5)));
  EXPECT_DOUBLE_EQ(schedule.at(50), 1.1);
  EXPECT_DOUBLE_EQ(schedule.at(75), 0.2 + 0.9 * (1.0 - std::sqrt(0.5)));
  EXPECT_DOUBLE_EQ(schedule.at(100), 0.2);
  EXPECT_DOUBLE_EQ(schedule.at(1000), 0.2) << "past the end it stays at the floor";
}

TEST(LrSchedule, CosineStartsAfterTheWarmUp) {
  const LrSchedule schedule(1.0, 110, 10, named("cosine", 10));
  EXPECT_DOUBLE_EQ(schedule.at(9), 1.0);
  EXPECT_DOUBLE_EQ(schedule.at(10), 1.0);
  EXPECT_DOUBLE_EQ(schedule.at(60), 0.5);  // halfway through the 100 steps after warm-up
  EXPECT_NEAR(schedule.at(110), 0.0, 1e-15);
}

TEST(LrSchedule, IsAPureFunctionOfTheStep) {
  const LrSchedule schedule(1.0, 100, 10, named("cosine", 5));
  const double late = schedule.at(73);
  for (int64_t step = 0; step < 100; ++step) schedule.at(step);
  EXPECT_EQ(schedule.at(73), late);
  EXPECT_EQ(LrSchedule(1.0, 100, 10, named("cosine", 5)).at(73), late) << "a resumed run";
}

TEST(LrSchedule, RejectsUnknownNamesAndInvalidValues) {
  try {
    LrSchedule(1.0, 100, 10, named("linear"));
    ADD_FAILURE() << "no error for an unknown schedule";
  } catch (const ConfigError& e) {
    EXPECT_STREQ(e.what(),
                 "unknown learning-rate schedule 'linear'; choose constant, step or cosine");
  }
  EXPECT_THROW(LrSchedule(1.0, 100, 10, named("Cosine")), ConfigError) << "names are exact";
  EXPECT_THROW(LrSchedule(1.0, 100, 10, named("constant", -1)), ConfigError);
  LrScheduleOptions step = named("step");
  step.step_epochs = 0;
  EXPECT_THROW(LrSchedule(1.0, 100, 10, step), ConfigError);
  // step_epochs only matters to the step schedule.
  LrScheduleOptions cosine = named("cosine");
  cosine.step_epochs = 0;
  EXPECT_NO_THROW(LrSchedule(1.0, 100, 10, cosine));
}

}  // namespace
}  // namespace ddp::train
