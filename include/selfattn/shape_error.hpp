/// \file
/// ShapeError alone, so that tensor.hpp (whose element-wise operators throw it) and errors.hpp (the checks of
/// every public entry) share it without including each other. Include errors.hpp or the umbrella header.
#pragma once

#include <stdexcept>

namespace selfattn {

/// \brief Thrown for a tensor argument of the wrong shape, rank or head count; an `std::invalid_argument`.
///
/// The message names the function, the argument, the expected and the actual shape. Value errors (a key
/// length out of range, a bad window, scale or dropout rate) are plain `std::invalid_argument`, so
/// `catch (const std::invalid_argument&)` catches both.
/// \code
/// Tensor<float, 4> q({2, 4, 5, 8}), k({2, 2, 6, 7}), v({2, 2, 6, 3});
/// try {
///   sdpa_forward(q, k, v);
/// } catch (const ShapeError& e) {
///   std::puts(e.what());   // [sdpa_forward] k: expected shape (2, *, *, 8), got (2, 2, 6, 7)
/// }
/// \endcode
class ShapeError : public std::invalid_argument {
 public:
  /// Constructs the error from its message (the constructors of std::invalid_argument).
  using std::invalid_argument::invalid_argument;
};

}  // namespace selfattn
