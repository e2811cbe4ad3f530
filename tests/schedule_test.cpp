// Tests of selfattn/train/schedule.hpp: the warmup rises linearly to the peak, the cosine starts at the peak, passes
// the midpoint halfway and ends at min_lr, no warmup starts at the peak; Noam's schedule against its formula and the
// paper's peak; out-of-range fields are named.
#include <selfattn/train/schedule.hpp>

#include "support/expect_error.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

namespace selfattn::test {
namespace {

WarmupCosineSchedule schedule(double peak, double min, Index warmup, Index total) {
  WarmupCosineSchedule s;
  s.peak_lr = peak;
  s.min_lr = min;
  s.warmup_steps = warmup;
  s.total_steps = total;
  return s;
}

TEST(WarmupCosineScheduleTest, WarmupThenCosine) {
  const WarmupCosineSchedule s = schedule(1e-2, 1e-3, 10, 110);
  EXPECT_DOUBLE_EQ(s.learning_rate(0), 1e-3);   // (0 + 1) / 10 of the peak
  EXPECT_DOUBLE_EQ(s.learning_rate(4), 5e-3);
  EXPECT_DOUBLE_EQ(s.learning_rate(9), 1e-2);   // the warmup ends at the peak ...
  EXPECT_DOUBLE_EQ(s.learning_rate(10), 1e-2);  // ... where the cosine starts
  EXPECT_NEAR(s.learning_rate(60), 5.5e-3, 1e-15);  // halfway: the mean of peak and min
  EXPECT_NEAR(s.learning_rate(35), 1e-3 + 9e-3 * (1 + std::cos(3.14159265358979323846 / 4)) / 2, 1e-15);
  EXPECT_GT(s.learning_rate(109), 1e-3);
  EXPECT_LT(s.learning_rate(109), 1.01e-3);
  EXPECT_DOUBLE_EQ(s.learning_rate(110), 1e-3);
  EXPECT_DOUBLE_EQ(s.learning_rate(1000), 1e-3);
  for (Index step = 11; step < 110; ++step) EXPECT_LT(s.learning_rate(step), s.learning_rate(step - 1)) << step;
}

TEST(WarmupCosineScheduleTest, NoWarmupAndNoDecay) {
  EXPECT_DOUBLE_EQ(schedule(2.0, 0.0, 0, 4).learning_rate(0), 2.0);
  EXPECT_DOUBLE_EQ(schedule(2.0, 0.0, 0, 4).learning_rate(2), 1.0);
  // total == warmup: a warmup, then min_lr at once.
  EXPECT_DOUBLE_EQ(schedule(2.0, 0.5, 4, 4).learning_rate(3), 2.0);
  EXPECT_DOUBLE_EQ(schedule(2.0, 0.5, 4, 4).learning_rate(4), 0.5);
  EXPECT_DOUBLE_EQ(schedule(0.5, 0.5, 2, 8).learning_rate(5), 0.5);  // constant after the warmup
}

TEST(WarmupCosineScheduleTest, ErrorsNameTheField) {
  const char* fn = "[WarmupCosineSchedule::learning_rate]";
  expect_error<std::invalid_argument>([&] { schedule(1e-3, -1, 0, 1).learning_rate(0); }, {fn, "min_lr"});
  expect_error<std::invalid_argument>([&] { schedule(1e-3, 1e-2, 0, 1).learning_rate(0); }, {"peak_lr", ">= min_lr"});
  expect_error<std::invalid_argument>([&] { schedule(std::numeric_limits<double>::infinity(), 0, 0, 1).learning_rate(0); },
                                      {"peak_lr"});
  expect_error<std::invalid_argument>([&] { schedule(1e-3, 0, -1, 1).learning_rate(0); }, {"warmup_steps", "got -1"});
  expect_error<std::invalid_argument>([&] { schedule(1e-3, 0, 5, 4).learning_rate(0); },
                                      {"total_steps", ">= warmup_steps (5), got 4"});
  expect_error<std::invalid_argument>([&] { schedule(1e-3, 0, 0, 4).learning_rate(-1); }, {"step", "got -1"});
}

NoamSchedule noam(Index model_dim, Index warmup, double factor = 1.0) {
  NoamSchedule s;
  s.model_dim = model_dim;
  s.warmup_steps = warmup;
  s.factor = factor;
  return s;
}

TEST(NoamScheduleTest, WarmupThenInverseSquareRoot) {
  const NoamSchedule s = noam(512, 4000);
  // The paper's formula with step_num = step + 1.
  const auto paper = [](double t) {
    return std::pow(512.0, -0.5) * std::min(std::pow(t, -0.5), t * std::pow(4000.0, -1.5));
  };
  for (Index step : {0, 1, 999, 3998, 3999, 4000, 10000, 99999})
    EXPECT_NEAR(s.learning_rate(step), paper(step + 1.0), 1e-18) << step;
  EXPECT_NEAR(s.learning_rate(3999), 6.9877e-4, 1e-8);  // the peak, 1 / sqrt(512 * 4000)
  for (Index step = 1; step < 3999; step += 97) EXPECT_LT(s.learning_rate(step - 1), s.learning_rate(step)) << step;
  for (Index step = 4001; step < 40000; step += 997)
    EXPECT_LT(s.learning_rate(step), s.learning_rate(step - 1)) << step;
  EXPECT_NEAR(s.learning_rate(4 * 4000 - 1), s.learning_rate(3999) / 2, 1e-15);  // halved at four times the steps
  EXPECT_DOUBLE_EQ(noam(512, 4000, 2.0).learning_rate(123), 2 * s.learning_rate(123));
  EXPECT_DOUBLE_EQ(noam(64, 1).learning_rate(0), 0.125);  // no warmup to speak of: 1 / sqrt(64) at t = 1
}

TEST(NoamScheduleTest, ErrorsNameTheField) {
  const char* fn = "[NoamSchedule::learning_rate]";
  expect_error<std::invalid_argument>([&] { noam(0, 10).learning_rate(0); }, {fn, "model_dim", "got 0"});
  expect_error<std::invalid_argument>([&] { noam(512, 0).learning_rate(0); }, {"warmup_steps", "got 0"});
  expect_error<std::invalid_argument>([&] { noam(512, 10, -1.0).learning_rate(0); }, {"factor"});
  expect_error<std::invalid_argument>([&] { noam(512, 10, std::nan("")).learning_rate(0); }, {"factor"});
  expect_error<std::invalid_argument>([&] { noam(512, 10).learning_rate(-3); }, {"step", "got -3"});
}

}  // namespace
}  // namespace selfattn::test
