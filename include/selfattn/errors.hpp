/// \file
/// ShapeError (defined in shape_error.hpp) and the checks every public entry runs before it computes anything.
///
/// Messages follow one pattern so a user can find the culprit at a glance:
/// \code{.unparsed}
///   [sdpa_forward] k: expected shape (2, 8, *, 64), got (2, 4, 10, 64)
/// \endcode
/// (`*` is "any extent"). Kernels never throw: they run after these checks.
#pragma once

#include <selfattn/shape_error.hpp>
#include <selfattn/tensor.hpp>

#include <array>
#include <stdexcept>
#include <string>
#include <string_view>

namespace selfattn {

namespace detail {

/// Wildcard extent in an expected shape.
constexpr Index any_extent = -1;

template <std::size_t Rank>
std::string expected_shape_string(const std::array<Index, Rank>& shape) {
  std::string text = "(";
  for (std::size_t d = 0; d < Rank; ++d) {
    if (d > 0) text += ", ";
    text += shape[d] == any_extent ? std::string("*") : std::to_string(shape[d]);
  }
  return text + ")";
}

[[noreturn]] inline void throw_shape_error(const char* function, const std::string& argument, const std::string& message) {
  throw ShapeError(std::string("[") + function + "] " + argument + ": " + message);
}

[[noreturn]] inline void throw_invalid(const char* function, const std::string& argument, const std::string& message) {
  throw std::invalid_argument(std::string("[") + function + "] " + argument + ": " + message);
}

/// Throws ShapeError unless `actual` matches `expected` (entries equal to any_extent match anything). The name is
/// a string_view so that a passing check allocates nothing (a loop of _into calls runs it every time).
template <std::size_t Rank>
void check_shape(const char* function, std::string_view argument, const std::array<Index, Rank>& actual,
                 const std::array<Index, Rank>& expected) {
  for (std::size_t d = 0; d < Rank; ++d)
    if (expected[d] != any_extent && actual[d] != expected[d])
      throw_shape_error(function, std::string(argument),
                        "expected shape " + expected_shape_string(expected) + ", got " + expected_shape_string(actual));
}

/// Throws ShapeError unless every dimension of `actual` is 1 or equal to `target` (NumPy-style broadcast
/// of a tensor of the same rank).
template <std::size_t Rank>
void check_broadcastable(const char* function, std::string_view argument, const std::array<Index, Rank>& actual,
                         const std::array<Index, Rank>& target) {
  for (std::size_t d = 0; d < Rank; ++d)
    if (actual[d] != 1 && actual[d] != target[d])
      throw_shape_error(function, std::string(argument),
                        "expected a shape broadcastable to " + expected_shape_string(target) +
                            " (each extent 1 or equal), got " + expected_shape_string(actual));
}

}  // namespace detail
}  // namespace selfattn
