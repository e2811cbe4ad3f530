// Tests of dropout.hpp: the counter-based stream is a pure function of (seed, b, h, i, j), uniform, and
// sensitive to every part of its key.
#include <selfattn/dropout.hpp>

#include <gtest/gtest.h>

#include <cmath>
#include <set>

namespace selfattn {
namespace {

TEST(DropoutTest, SameKeySameNumberEveryTime) {
  for (Index j = 0; j < 100; ++j) EXPECT_EQ(detail::dropout_uniform(42, 1, 2, 3, j), detail::dropout_uniform(42, 1, 2, 3, j));
}

TEST(DropoutTest, EveryPartOfTheKeyChangesTheNumber) {
  const double base = detail::dropout_uniform(7, 1, 1, 1, 1);
  EXPECT_NE(base, detail::dropout_uniform(8, 1, 1, 1, 1));
  EXPECT_NE(base, detail::dropout_uniform(7, 2, 1, 1, 1));
  EXPECT_NE(base, detail::dropout_uniform(7, 1, 2, 1, 1));
  EXPECT_NE(base, detail::dropout_uniform(7, 1, 1, 2, 1));
  EXPECT_NE(base, detail::dropout_uniform(7, 1, 1, 1, 2));
  // Swapping coordinates must not collide (a symmetric hash would).
  EXPECT_NE(detail::dropout_uniform(7, 0, 0, 1, 2), detail::dropout_uniform(7, 0, 0, 2, 1));
}

TEST(DropoutTest, UniformOnTheUnitInterval) {
  const int n = 200000;
  double sum = 0, sum_squares = 0;
  int kept = 0;
  detail::DropoutParams<float> dropout;
  dropout.p = 0.3f;
  dropout.seed = 123;
  for (int t = 0; t < n; ++t) {
    const double u = detail::dropout_uniform(123, t % 3, t % 7, t / 64, t % 64);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
    sum_squares += u * u;
    kept += dropout.keep(t % 3, t % 7, t / 64, t % 64);
  }
  EXPECT_NEAR(sum / n, 0.5, 0.005);
  EXPECT_NEAR(sum_squares / n - (sum / n) * (sum / n), 1.0 / 12, 0.002);
  EXPECT_NEAR(static_cast<double>(kept) / n, 0.7, 0.01);
  EXPECT_FLOAT_EQ(dropout.keep_scale(), 1.0f / 0.7f);
}

TEST(DropoutTest, InactiveAtZero) {
  detail::DropoutParams<double> dropout;
  EXPECT_FALSE(dropout.active());
  dropout.p = 0.1;
  EXPECT_TRUE(dropout.active());
}

}  // namespace
}  // namespace selfattn
