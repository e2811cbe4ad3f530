// Tests of selfattn/train/adamw.hpp: AdamW against the textbook formulas (computed here independently, in long
// double) over several steps with changing gradients, decoupled decay only where ParameterRef::decay, the first
// step's size (lr in the gradient's sign), a quadratic minimised, float against double, and the errors (config
// fields, lr, a list that changes after the first step) leaving the parameters untouched.
#include <selfattn/train/adamw.hpp>

#include "support/expect_error.hpp"
#include "support/random.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <stdexcept>
#include <vector>

namespace selfattn::test {
namespace {

// Adam with decoupled weight decay as Loshchilov & Hutter write it, for one element.
struct ReferenceElement {
  long double w, m = 0, v = 0;
  void step(long double g, long double lr, int t, bool decay, const AdamWConfig& c) {
    if (decay) w -= lr * c.weight_decay * w;
    m = c.beta1 * m + (1 - c.beta1) * g;
    v = c.beta2 * v + (1 - c.beta2) * g * g;
    const long double m_hat = m / (1 - std::pow(static_cast<long double>(c.beta1), t));
    const long double v_hat = v / (1 - std::pow(static_cast<long double>(c.beta2), t));
    w -= lr * m_hat / (std::sqrt(v_hat) + c.eps);
  }
};

TEST(AdamWTest, MatchesTheFormulasOverSeveralSteps) {
  AdamWConfig cfg;
  cfg.beta1 = 0.8;
  cfg.beta2 = 0.95;
  cfg.eps = 1e-6;
  cfg.weight_decay = 0.3;
  Random rng(1);
  Tensor<double, 2> w = rng.normal_tensor<double, 2>({3, 4}), gw({3, 4});
  Tensor<double, 1> b = rng.normal_tensor<double, 1>({5}), gb({5});
  std::vector<ReferenceElement> ref_w, ref_b;
  for (Index n = 0; n < w.size(); ++n) ref_w.push_back({w.data()[n]});
  for (Index n = 0; n < b.size(); ++n) ref_b.push_back({b.data()[n]});
  AdamW<double> adamw(cfg);
  for (int t = 1; t <= 6; ++t) {
    const double lr = 0.05 / t;  // a schedule: the rate may change every step
    for (Index n = 0; n < gw.size(); ++n) gw.data()[n] = rng.normal();
    for (Index n = 0; n < gb.size(); ++n) gb.data()[n] = rng.normal() * 1e-3;
    std::vector<ParameterRef<double>> params;
    add_parameter(params, "w", w, gw, true);
    add_parameter(params, "b", b, gb, false);
    adamw.step(params, lr);
    for (Index n = 0; n < w.size(); ++n) ref_w[static_cast<std::size_t>(n)].step(gw.data()[n], lr, t, true, cfg);
    for (Index n = 0; n < b.size(); ++n) ref_b[static_cast<std::size_t>(n)].step(gb.data()[n], lr, t, false, cfg);
    for (Index n = 0; n < w.size(); ++n)
      EXPECT_NEAR(w.data()[n], static_cast<double>(ref_w[static_cast<std::size_t>(n)].w), 1e-14) << "t " << t;
    for (Index n = 0; n < b.size(); ++n)
      EXPECT_NEAR(b.data()[n], static_cast<double>(ref_b[static_cast<std::size_t>(n)].w), 1e-14) << "t " << t;
  }
  EXPECT_EQ(adamw.steps(), 6);
  EXPECT_NEAR(adamw.first_moment(0)[0], static_cast<double>(ref_w[0].m), 1e-15);
  EXPECT_NEAR(adamw.second_moment(1)[4], static_cast<double>(ref_b[4].v), 1e-15);
}

TEST(AdamWTest, TheFirstStepMovesEachElementByLrAgainstItsGradient) {
  // t = 1: m_hat = g, v_hat = g^2, so the step is lr g / (|g| + eps), lr in the sign of g whatever its size.
  AdamWConfig cfg;
  cfg.weight_decay = 0;
  Tensor<double, 1> w({4}), g({4});
  g(0) = 1e-4, g(1) = -3.0, g(2) = 250.0, g(3) = 0.0;
  std::vector<ParameterRef<double>> params;
  add_parameter(params, "w", w, g, true);
  AdamW<double> adamw(cfg);
  adamw.step(params, 0.01);
  EXPECT_NEAR(w(0), -0.01, 1e-6);
  EXPECT_NEAR(w(1), 0.01, 1e-10);
  EXPECT_NEAR(w(2), -0.01, 1e-12);
  EXPECT_EQ(w(3), 0.0);
}

TEST(AdamWTest, DecayIsDecoupledAndOnlyWhereAsked) {
  // Zero gradients: Adam's part is 0, so a decayed parameter shrinks by (1 - lr wd) per step and the other stays.
  AdamWConfig cfg;
  cfg.weight_decay = 0.5;
  Tensor<float, 1> decayed({2}), kept({2}), g1({2}), g2({2});
  decayed.fill(2.0f);
  kept.fill(2.0f);
  std::vector<ParameterRef<float>> params;
  add_parameter(params, "decayed", decayed, g1, true);
  add_parameter(params, "kept", kept, g2, false);
  AdamW<float> adamw(cfg);
  for (int t = 0; t < 3; ++t) adamw.step(params, 0.1);
  EXPECT_NEAR(decayed(0), 2.0 * std::pow(1 - 0.1 * 0.5, 3), 1e-6);
  EXPECT_EQ(kept(1), 2.0f);
}

TEST(AdamWTest, MinimisesAQuadratic) {
  // f(w) = sum (w - c)^2 / 2, gradient w - c; no decay: w goes to c.
  AdamWConfig cfg;
  cfg.weight_decay = 0;
  Random rng(2);
  const Tensor<double, 1> c = rng.normal_tensor<double, 1>({6}, 3.0);
  Tensor<double, 1> w({6}), g({6});
  std::vector<ParameterRef<double>> params;
  add_parameter(params, "w", w, g, true);
  AdamW<double> adamw(cfg);
  for (int t = 0; t < 2000; ++t) {
    for (Index n = 0; n < 6; ++n) g(n) = w(n) - c(n);
    adamw.step(params, t < 1500 ? 0.05 : 0.005);
  }
  for (Index n = 0; n < 6; ++n) EXPECT_NEAR(w(n), c(n), 1e-3);
}

TEST(AdamWTest, FloatAgreesWithDouble) {
  Random rng(3);
  Tensor<double, 2> wd = rng.normal_tensor<double, 2>({4, 4}), gd({4, 4});
  Tensor<float, 2> wf(wd.shape()), gf(wd.shape());
  for (Index n = 0; n < wd.size(); ++n) wf.data()[n] = static_cast<float>(wd.data()[n]);
  std::vector<ParameterRef<double>> pd;
  std::vector<ParameterRef<float>> pf;
  add_parameter(pd, "w", wd, gd, true);
  add_parameter(pf, "w", wf, gf, true);
  AdamW<double> ad;
  AdamW<float> af;
  for (int t = 0; t < 20; ++t) {
    for (Index n = 0; n < wd.size(); ++n) gf.data()[n] = static_cast<float>(gd.data()[n] = rng.normal());
    ad.step(pd, 1e-2);
    af.step(pf, 1e-2);
  }
  for (Index n = 0; n < wd.size(); ++n) EXPECT_NEAR(wf.data()[n], wd.data()[n], 1e-5);
}

TEST(AdamWTest, ConfigErrorsNameTheField) {
  const auto config = [](double b1, double b2, double eps, double wd) {
    AdamWConfig c;
    c.beta1 = b1, c.beta2 = b2, c.eps = eps, c.weight_decay = wd;
    return c;
  };
  expect_error<std::invalid_argument>([&] { AdamW<float> a(config(1.0, 0.9, 1e-8, 0)); }, {"[AdamW]", "config.beta1"});
  expect_error<std::invalid_argument>([&] { AdamW<float> a(config(0.9, -0.1, 1e-8, 0)); }, {"config.beta2"});
  expect_error<std::invalid_argument>([&] { AdamW<float> a(config(0.9, 0.9, 0, 0)); }, {"config.eps"});
  expect_error<std::invalid_argument>([&] { AdamW<float> a(config(0.9, 0.9, 1e-8, -1)); }, {"config.weight_decay"});
  const double nan = std::numeric_limits<double>::quiet_NaN();
  expect_error<std::invalid_argument>([&] { AdamW<float> a(config(nan, 0.9, 1e-8, 0)); }, {"config.beta1"});
}

TEST(AdamWTest, AnotherListAfterTheFirstStepThrowsAndChangesNothing) {
  Tensor<double, 1> a({3}), ga({3}), b({2}), gb({2});
  ga.fill(1.0);
  gb.fill(1.0);
  AdamW<double> adamw;
  std::vector<ParameterRef<double>> first;
  add_parameter(first, "a", a, ga, true);
  add_parameter(first, "b", b, gb, true);
  adamw.step(first, 0.1);
  const Tensor<double, 1> a_before = a;

  std::vector<ParameterRef<double>> shorter(first.begin(), first.begin() + 1);
  expect_error<std::invalid_argument>([&] { adamw.step(shorter, 0.1); },
                                      {"[AdamW::step]", "params", "expected the 2 parameters of the first step, got 1"});
  std::vector<ParameterRef<double>> renamed = first;
  renamed[1].name = "c";
  expect_error<std::invalid_argument>([&] { adamw.step(renamed, 0.1); }, {"params[1]", "'c'", "'b'"});
  std::vector<ParameterRef<double>> resized = first;
  resized[0].size = 2;
  expect_error<std::invalid_argument>([&] { adamw.step(resized, 0.1); }, {"params[0]", "of 2 elements", "of 3"});
  for (double lr : {-1.0, std::numeric_limits<double>::infinity(), std::numeric_limits<double>::quiet_NaN()})
    expect_error<std::invalid_argument>([&] { adamw.step(first, lr); }, {"[AdamW::step]", "lr"});
  std::vector<ParameterRef<double>> null_grad = first;
  null_grad[0].grad = nullptr;
  expect_error<std::invalid_argument>([&] { adamw.step(null_grad, 0.1); }, {"params", "'a'", "null"});
  for (Index n = 0; n < a.size(); ++n) EXPECT_EQ(a(n), a_before(n));
  EXPECT_EQ(adamw.steps(), 1);
}

}  // namespace
}  // namespace selfattn::test
