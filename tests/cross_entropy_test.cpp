// Tests of selfattn/train/cross_entropy.hpp: the loss against a hand computation and a value worked out by hand,
// the gradient by central finite differences in double (ignored positions included), ignore_index, NaN when every
// position is ignored, no overflow for huge logits, float against double, and the errors naming `targets`.
#include <selfattn/train/cross_entropy.hpp>

#include "support/compare.hpp"
#include "support/expect_error.hpp"
#include "support/gradcheck.hpp"
#include "support/random.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>
#include <vector>

namespace selfattn::test {
namespace {

Tensor<Index, 2> random_targets(Random& rng, Index batch, Index length, Index classes) {
  Tensor<Index, 2> t({batch, length});
  for (Index n = 0; n < t.size(); ++n) t.data()[n] = rng.integer(0, classes - 1);
  return t;
}

// -log softmax(z)[t], straight from the definition, in long double.
double row_loss(const double* z, Index classes, Index t) {
  long double sum = 0;
  for (Index v = 0; v < classes; ++v) sum += std::exp(static_cast<long double>(z[v]));
  return static_cast<double>(std::log(sum) - static_cast<long double>(z[t]));
}

TEST(CrossEntropyTest, AWorkedExample) {
  // logits (1, 1, 3) = [1, 2, 3], target 2:  loss = log(e + e^2 + e^3) - 3 = log(1 + e^-1 + e^-2)
  Tensor<double, 3> logits({1, 1, 3});
  logits(0, 0, 0) = 1, logits(0, 0, 1) = 2, logits(0, 0, 2) = 3;
  Tensor<Index, 2> target({1, 1});
  target(0, 0) = 2;
  const CrossEntropy<double> ce = softmax_cross_entropy<double>(logits, target);
  EXPECT_NEAR(ce.loss, 0.40760596444438030, 1e-15);  // to 40 digits: 0.40760596444438030448...
  EXPECT_EQ(ce.count, 1);
  const double e1 = std::exp(1.0), e2 = std::exp(2.0), e3 = std::exp(3.0), s = e1 + e2 + e3;
  EXPECT_NEAR(ce.d_logits(0, 0, 0), e1 / s, 1e-15);
  EXPECT_NEAR(ce.d_logits(0, 0, 1), e2 / s, 1e-15);
  EXPECT_NEAR(ce.d_logits(0, 0, 2), e3 / s - 1, 1e-15);
}

TEST(CrossEntropyTest, UniformLogitsGiveLogV) {
  Tensor<float, 3> logits({2, 3, 10});
  logits.fill(0.25f);
  Random rng(1);
  const Tensor<Index, 2> targets = random_targets(rng, 2, 3, 10);
  const CrossEntropy<float> ce = softmax_cross_entropy<float>(logits, targets);
  EXPECT_NEAR(ce.loss, std::log(10.0), 1e-12);
}

TEST(CrossEntropyTest, LossIsTheMeanOfTheRowsLosses) {
  Random rng(2);
  const Tensor<double, 3> logits = rng.normal_tensor<double, 3>({3, 4, 9}, 3.0);
  const Tensor<Index, 2> targets = random_targets(rng, 3, 4, 9);
  double expected = 0;
  for (Index b = 0; b < 3; ++b)
    for (Index l = 0; l < 4; ++l) expected += row_loss(&logits(b, l, 0), 9, targets(b, l));
  EXPECT_NEAR(softmax_cross_entropy<double>(logits, targets).loss, expected / 12, 1e-14);
}

TEST(CrossEntropyTest, GradientMatchesFiniteDifferences) {
  Random rng(3);
  Tensor<double, 3> logits = rng.normal_tensor<double, 3>({2, 5, 7}, 2.0);
  Tensor<Index, 2> targets = random_targets(rng, 2, 5, 7);
  targets(0, 3) = -100;  // ignored: a zero row of the gradient, and not in the mean
  targets(1, 0) = -100;
  const CrossEntropy<double> ce = softmax_cross_entropy<double>(logits, targets);
  EXPECT_EQ(ce.count, 8);
  const Tensor<double, 3> numeric =
      numerical_gradient(logits, [&] { return softmax_cross_entropy<double>(logits, targets).loss; });
  EXPECT_TRUE(all_close(ce.d_logits, numeric, 1e-9));
  for (Index v = 0; v < 7; ++v) {
    EXPECT_EQ(ce.d_logits(0, 3, v), 0.0);
    EXPECT_EQ(ce.d_logits(1, 0, v), 0.0);
  }
}

TEST(CrossEntropyTest, EachCountedRowOfTheGradientSumsToZero) {
  Random rng(4);
  const Tensor<float, 3> logits = rng.normal_tensor<float, 3>({4, 6, 50}, 4.0);
  const Tensor<Index, 2> targets = random_targets(rng, 4, 6, 50);
  const CrossEntropy<float> ce = softmax_cross_entropy<float>(logits, targets);
  for (Index b = 0; b < 4; ++b)
    for (Index l = 0; l < 6; ++l) {
      double sum = 0;
      for (Index v = 0; v < 50; ++v) sum += ce.d_logits(b, l, v);
      EXPECT_NEAR(sum, 0.0, 1e-8);
    }
}

TEST(CrossEntropyTest, AnotherIgnoreIndexAndTheLossAlone) {
  Random rng(5);
  const Tensor<double, 3> logits = rng.normal_tensor<double, 3>({1, 4, 5});
  Tensor<Index, 2> targets = random_targets(rng, 1, 4, 5);
  targets(0, 1) = 3;
  CrossEntropyOptions opts;
  opts.ignore_index = 3;  // a valid class id, ignored all the same
  opts.gradient = false;
  const CrossEntropy<double> ce = softmax_cross_entropy<double>(logits, targets, opts);
  double expected = 0;
  Index count = 0;
  for (Index l = 0; l < 4; ++l)
    if (targets(0, l) != 3) expected += row_loss(&logits(0, l, 0), 5, targets(0, l)), ++count;
  EXPECT_EQ(ce.count, count);
  EXPECT_NEAR(ce.loss, expected / static_cast<double>(count), 1e-14);
  EXPECT_EQ(ce.d_logits.size(), 0);
}

TEST(CrossEntropyTest, EveryTargetIgnoredGivesNaNAndZeroGradient) {
  Tensor<float, 3> logits({2, 2, 3});
  logits.fill(1.0f);
  Tensor<Index, 2> targets({2, 2});
  targets.fill(-100);
  const CrossEntropy<float> ce = softmax_cross_entropy<float>(logits, targets);
  EXPECT_TRUE(std::isnan(ce.loss));
  EXPECT_EQ(ce.count, 0);
  ASSERT_EQ(ce.d_logits.shape(), logits.shape());
  for (Index n = 0; n < ce.d_logits.size(); ++n) EXPECT_EQ(ce.d_logits.data()[n], 0.0f);
  const Tensor<float, 3> no_logits({0, 4, 3});
  const Tensor<Index, 2> no_targets({0, 4});
  EXPECT_TRUE(std::isnan(softmax_cross_entropy<float>(no_logits, no_targets).loss));
}

TEST(CrossEntropyTest, HugeLogitsDoNotOverflow) {
  // exp(1e4) overflows even in double: the max is subtracted first. The loss and gradient equal the shifted ones.
  Random rng(6);
  const Tensor<double, 3> small = rng.normal_tensor<double, 3>({2, 3, 6});
  Tensor<double, 3> huge = small;
  for (Index n = 0; n < huge.size(); ++n) huge.data()[n] += 1e4;
  const Tensor<Index, 2> targets = random_targets(rng, 2, 3, 6);
  const CrossEntropy<double> a = softmax_cross_entropy<double>(small, targets);
  const CrossEntropy<double> b = softmax_cross_entropy<double>(huge, targets);
  EXPECT_NEAR(a.loss, b.loss, 1e-11);
  EXPECT_TRUE(all_close(b.d_logits, a.d_logits, 1e-11));
  Tensor<float, 3> big_float({1, 1, 2});
  big_float(0, 0, 0) = 1e30f;  // the other class has probability exp(-1e30) = 0, its loss exactly 1e30
  Tensor<Index, 2> second({1, 1});
  second(0, 0) = 1;
  EXPECT_EQ(softmax_cross_entropy<float>(big_float, second).loss, 1e30f);
}

TEST(CrossEntropyTest, FloatAgreesWithDouble) {
  Random rng(7);
  const Tensor<double, 3> logits = rng.normal_tensor<double, 3>({3, 8, 40}, 3.0);
  Tensor<float, 3> logits_f(logits.shape());
  for (Index n = 0; n < logits.size(); ++n) logits_f.data()[n] = static_cast<float>(logits.data()[n]);
  const Tensor<Index, 2> targets = random_targets(rng, 3, 8, 40);
  const CrossEntropy<double> d = softmax_cross_entropy<double>(logits, targets);
  const CrossEntropy<float> f = softmax_cross_entropy<float>(logits_f, targets);
  EXPECT_NEAR(f.loss, d.loss, 1e-6);
  EXPECT_TRUE(all_close(f.d_logits, d.d_logits, 1e-7));
}

TEST(CrossEntropyTest, ErrorsNameTargets) {
  const Tensor<float, 3> logits({2, 3, 4});
  const Tensor<Index, 2> short_targets({2, 2});
  expect_error<ShapeError>([&] { (void)softmax_cross_entropy<float>(logits, short_targets); },
                           {"[softmax_cross_entropy]", "targets", "expected shape (2, 3), got (2, 2)"});
  Tensor<Index, 2> targets({2, 3});
  targets(1, 2) = 4;
  expect_error<std::invalid_argument>([&] { (void)softmax_cross_entropy<float>(logits, targets); },
                                      {"targets", "id 4 at (1, 2)", "[0, 4)", "ignore_index (-100)"});
  targets(1, 2) = -1;
  expect_error<std::invalid_argument>([&] { (void)softmax_cross_entropy<float>(logits, targets); },
                                      {"targets", "id -1 at (1, 2)"});
}

}  // namespace
}  // namespace selfattn::test
