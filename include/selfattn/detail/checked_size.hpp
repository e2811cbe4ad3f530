/// \file
/// Overflow-checked sizes. Every element count, stride, offset and byte count computed from user input (a tensor's
/// shape, a view's strides, a KV cache's capacity, a workspace's buffers) goes through checked_mul and checked_add,
/// so that a size too large to exist throws a std::length_error that names it, before anything is allocated,
/// instead of wrapping to a small number and writing past a small buffer.
#pragma once

#include <array>
#include <cstddef>
#include <limits>
#include <stdexcept>
#include <string>
#include <string_view>

namespace selfattn::detail {

/// The largest size anything may have, in bytes or elements: PTRDIFF_MAX, since pointer differences within one
/// object must be representable (std::vector's max_size is the same bound).
inline constexpr std::ptrdiff_t max_object_size = std::numeric_limits<std::ptrdiff_t>::max();

/// The most elements of `element_bytes` bytes each that one allocation may hold (at most max_object_size bytes).
constexpr std::ptrdiff_t max_elements(std::size_t element_bytes) {
  return max_object_size / static_cast<std::ptrdiff_t>(element_bytes);
}

/// The text of the error of a size past its limit: "[function] argument: <what> exceeds the limit of <limit>
/// <unit>". `what` says which size (the shape, strides...) in the caller's words.
inline std::string size_limit_message(std::string_view function, std::string_view argument, std::string_view what,
                                      std::ptrdiff_t limit, std::string_view unit) {
  std::string text = "[";
  text.append(function).append("] ").append(argument).append(": ").append(what);
  text.append(" exceeds the limit of ").append(std::to_string(limit)).append(" ").append(unit);
  return text;
}

/// a * b for sizes a, b >= 0, when the product is at most `limit`; else throws std::length_error(message()).
/// `message` is a callable returning the error's text, called only on the error (a passing check builds no string).
template <typename Message>
std::ptrdiff_t checked_mul(std::ptrdiff_t a, std::ptrdiff_t b, std::ptrdiff_t limit, Message&& message) {
  if (a != 0 && b > limit / a) throw std::length_error(message());
  return a * b;
}

/// a + b for sizes a, b >= 0, when the sum is at most `limit`; else throws std::length_error(message()).
template <typename Message>
std::ptrdiff_t checked_add(std::ptrdiff_t a, std::ptrdiff_t b, std::ptrdiff_t limit, Message&& message) {
  if (b > limit - a) throw std::length_error(message());
  return a + b;
}

/// The product of `extents` (each >= 0), when the product of the nonzero ones is at most `limit`; else throws
/// std::length_error(message()). The nonzero ones, since row-major strides multiply trailing extents up to a zero:
/// a shape (0, 2^40, 2^40) holds no element but its first stride would still wrap.
template <std::size_t N, typename Message>
std::ptrdiff_t checked_product(const std::array<std::ptrdiff_t, N>& extents, std::ptrdiff_t limit,
                               Message&& message) {
  std::ptrdiff_t product = 1;
  bool empty = false;
  for (std::ptrdiff_t extent : extents) {
    if (extent == 0) empty = true;
    else product = checked_mul(product, extent, limit, message);
  }
  return empty ? 0 : product;
}

}  // namespace selfattn::detail
