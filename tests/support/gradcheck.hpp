// tests/support/gradcheck.hpp — central finite differences in double, to check analytic gradients.
//
//   auto numeric = numerical_gradient(q, [&] { return loss(); });
//   EXPECT_TRUE(all_close(analytic.dq, numeric, gradient_tolerance));
#pragma once

#include <selfattn/tensor.hpp>

#include "compare.hpp"
#include "sanitizers.hpp"

#include <gtest/gtest.h>

#include <string>

namespace selfattn::test {

/// How close (all_close, relative) a gradient and its central differences must be: for smooth functions in double,
/// truncation ~h^2 and rounding ~eps/h at the default step h = 1e-6 leave ~1e-8 relative.
constexpr double gradient_tolerance = 1e-7;

/// d loss / d x_n by central differences, (loss(x + h e_n) - loss(x - h e_n)) / 2h. `x` is perturbed in place and
/// restored exactly; `loss` must read it.
template <int Rank, typename Loss>
double central_difference(Tensor<double, Rank>& x, Index n, Loss&& loss, double step = 1e-6) {
  const double original = x.data()[n];
  x.data()[n] = original + step;
  const double up = loss();
  x.data()[n] = original - step;
  const double down = loss();
  x.data()[n] = original;
  return (up - down) / (2 * step);
}

/// d loss / d x by central differences, for every element.
template <int Rank, typename Loss>
Tensor<double, Rank> numerical_gradient(Tensor<double, Rank>& x, Loss&& loss, double step = 1e-6) {
  Tensor<double, Rank> gradient(x.shape());
  for (Index n = 0; n < x.size(); ++n) gradient.data()[n] = central_difference(x, n, loss, step);
  return gradient;
}

/// Checks an analytic gradient against central differences of `loss` in `param` (perturbed and restored in place); an
/// absent (empty) parameter must have an empty gradient. Under a sanitizer (sanitizers.hpp) every third element is
/// differenced, the others taken as the analytic values: two forward passes per element made the module gradient
/// tests the sanitize stage's longest (transformer_decoder_test: 39 s under ASan, AMD EPYC Zen 3), and the memory
/// errors a sanitizer looks for show on any element; the optimised build checks every one.
template <int Rank, typename Loss>
void expect_gradient(const std::string& name, Tensor<double, Rank>& param, const Tensor<double, Rank>& grad,
                     Loss&& loss) {
  if (param.size() == 0) {
    EXPECT_EQ(grad.size(), 0) << name << ": the parameter is absent, its gradient must be empty";
    return;
  }
  if (!sanitized || grad.size() != param.size()) {
    EXPECT_TRUE(all_close(grad, numerical_gradient(param, loss), gradient_tolerance)) << name;
    return;
  }
  Tensor<double, Rank> numeric = grad;
  for (Index n = 0; n < param.size(); n += 3) numeric.data()[n] = central_difference(param, n, loss);
  EXPECT_TRUE(all_close(grad, numeric, gradient_tolerance)) << name << " (every third element, under a sanitizer)";
}

/// sum(y * weights): a scalar loss whose gradient with respect to y is `weights`.
template <typename Y, typename W>
double weighted_sum(const Y& y, const W& weights) {
  double sum = 0;
  for (Index n = 0; n < y.size(); ++n) sum += static_cast<double>(y.data()[n]) * static_cast<double>(weights.data()[n]);
  return sum;
}

}  // namespace selfattn::test
