// tests/support/compare.hpp — tensor comparison that says where and by how much two tensors differ.
//
//   EXPECT_TRUE(all_close(actual, expected, 1e-12));
// fails with: "worst at (1, 0, 3, 2): actual 0.5, expected 0.50001, |diff| 1e-05 > tolerance 1e-12 ..."
// The tolerance is relative to the largest |expected| (at least 1), so values near 0 are judged on the
// scale of the tensor rather than their own.
#pragma once

#include <selfattn/tensor.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <sstream>
#include <string>

namespace selfattn::test {

template <typename T>
constexpr double default_tolerance() {
  return std::is_same_v<T, float> ? 1e-5 : 1e-12;
}

template <int Rank>
std::string index_string(Index flat, const std::array<Index, Rank>& shape) {
  std::array<Index, Rank> at{};
  for (int d = Rank - 1; d >= 0; --d) {
    const Index extent = std::max<Index>(shape[static_cast<std::size_t>(d)], 1);
    at[static_cast<std::size_t>(d)] = flat % extent;
    flat /= extent;
  }
  return detail::shape_string<Rank>(at);
}

/// Elementwise |a - e| <= tolerance * max(1, max |e|); NaN equals NaN only where both are NaN.
template <typename A, typename E, int Rank = detail::tensor_traits<std::decay_t<A>>::rank>
::testing::AssertionResult all_close(const A& actual_tensor, const E& expected_tensor, double tolerance) {
  const auto actual = detail::const_view(actual_tensor);
  const auto expected = detail::const_view(expected_tensor);
  if (actual.shape() != expected.shape())
    return ::testing::AssertionFailure() << "shape " << detail::shape_string<Rank>(actual.shape()) << " differs from expected "
                                         << detail::shape_string<Rank>(expected.shape());
  const Tensor<detail::scalar_of<A>, Rank> a(actual);
  const Tensor<detail::scalar_of<E>, Rank> e(expected);
  double scale = 1.0;
  for (Index n = 0; n < e.size(); ++n)
    if (std::isfinite(static_cast<double>(e.data()[n]))) scale = std::max(scale, std::abs(static_cast<double>(e.data()[n])));
  double worst = -1.0;
  Index worst_at = -1;
  for (Index n = 0; n < a.size(); ++n) {
    const double x = static_cast<double>(a.data()[n]), y = static_cast<double>(e.data()[n]);
    double diff;
    if (std::isnan(x) || std::isnan(y))
      diff = std::isnan(x) && std::isnan(y) ? 0.0 : INFINITY;
    else if (std::isinf(x) || std::isinf(y))
      diff = x == y ? 0.0 : INFINITY;
    else
      diff = std::abs(x - y);
    if (diff > worst) {
      worst = diff;
      worst_at = n;
    }
  }
  std::ostringstream text;
  text.precision(17);
  if (worst_at >= 0)
    text << "worst at " << index_string<Rank>(worst_at, a.shape()) << ": actual " << a.data()[worst_at] << ", expected "
         << e.data()[worst_at] << ", |diff| " << worst;
  if (worst <= tolerance * scale) return ::testing::AssertionSuccess() << text.str();
  return ::testing::AssertionFailure() << text.str() << " > tolerance " << tolerance << " * scale " << scale;
}

/// Largest |a - e| over all elements (both finite), for tests that compare errors against each other.
template <typename A, typename E>
double max_abs_difference(const A& actual_tensor, const E& expected_tensor) {
  const auto actual = detail::const_view(actual_tensor);
  const auto expected = detail::const_view(expected_tensor);
  constexpr int Rank = detail::tensor_traits<std::decay_t<A>>::rank;
  const Tensor<detail::scalar_of<A>, Rank> a(actual);
  const Tensor<detail::scalar_of<E>, Rank> e(expected);
  double worst = 0.0;
  for (Index n = 0; n < a.size(); ++n)
    worst = std::max(worst, std::abs(static_cast<double>(a.data()[n]) - static_cast<double>(e.data()[n])));
  return worst;
}

/// True when any element is NaN.
template <typename X>
bool has_nan(const X& tensor) {
  constexpr int Rank = detail::tensor_traits<std::decay_t<X>>::rank;
  const Tensor<detail::scalar_of<X>, Rank> t(detail::const_view(tensor));
  for (Index n = 0; n < t.size(); ++n)
    if (std::isnan(static_cast<double>(t.data()[n]))) return true;
  return false;
}

}  // namespace selfattn::test
