/// \file
/// Half-width storage: `bfloat16` and `float16` element types for tensors, attention inputs and the KV cache,
/// their compute type (float), and conversions between storage and compute types.
///
/// 16-bit types are for storage only: attention on 16-bit inputs computes its scores, softmax and sums in float
/// (`compute_type_t<bfloat16>` is float) and rounds once, to nearest even, when it stores a 16-bit result. What is
/// computed in which type, and the accuracy that follows, is docs/half_precision.md.
#pragma once

#include <selfattn/tensor.hpp>

#include <Eigen/Core>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace selfattn {

/// Brain floating point: 8 exponent bits like float, 8 significand bits (7 stored). Eigen's type.
using bfloat16 = Eigen::bfloat16;
/// IEEE 754 binary16: 5 exponent bits, 11 significand bits (10 stored); largest finite 65504. Eigen's type.
using float16 = Eigen::half;

/// Whether T is one of the 16-bit storage types (bfloat16, float16).
template <typename T>
inline constexpr bool is_half_width_v = std::is_same_v<T, bfloat16> || std::is_same_v<T, float16>;

/// Whether T is an element type attention accepts: float, double, bfloat16 or float16.
template <typename T>
inline constexpr bool is_attention_element_v = std::is_same_v<T, float> || std::is_same_v<T, double> || is_half_width_v<T>;

/// \brief The type arithmetic on elements of T is done in: T itself for float and double, float for the 16-bit
/// storage types (scores, softmax, sums, log-sum-exp, attention weights, option values such as a bias).
template <typename T>
struct compute_type {
  using type = T;  ///< float and double compute in themselves
};
/// \overload
template <>
struct compute_type<bfloat16> {
  using type = float;  ///< bfloat16 computes in float
};
/// \overload
template <>
struct compute_type<float16> {
  using type = float;  ///< float16 computes in float
};
/// `compute_type<T>::type`.
template <typename T>
using compute_type_t = typename compute_type<T>::type;

namespace detail {

/// One element of storage type S as compute type T, exactly (every bfloat16 and float16 is a float).
template <typename T, typename S>
EIGEN_ALWAYS_INLINE T widen(const S& x) {
  if constexpr (std::is_same_v<S, T>) {
    return x;
  } else if constexpr (std::is_same_v<S, bfloat16>) {
    // A bfloat16 is the upper half of a float's bits.
    std::uint16_t raw;
    std::memcpy(&raw, &x, sizeof raw);
    const std::uint32_t bits = static_cast<std::uint32_t>(raw) << 16;
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return static_cast<T>(f);
  } else {
    return static_cast<T>(static_cast<float>(x));
  }
}

/// double -> float rounding to odd: exact values are kept, any other goes to the float of the two around it
/// whose last significand bit is 1 (beyond the float range: FLT_MAX, below it: the smallest subnormal, both
/// signed). Rounding that float to nearest-even at 2 or more bits less precision (float16: 11 bits,
/// bfloat16: 8, against float's 24) then gives the correctly rounded result of the double (Boldo and
/// Melquiond, "When double rounding is odd", 2005); rounding the double to nearest float first would not.
inline float narrow_to_float_round_to_odd(double value) {
  float nearest = static_cast<float>(value);
  if (std::isnan(value) || static_cast<double>(nearest) == value) return nearest;  // exact, infinite or NaN
  if (std::fabs(static_cast<double>(nearest)) > std::fabs(value)) nearest = std::nextafter(nearest, 0.0f);  // toward 0
  std::uint32_t bits;
  std::memcpy(&bits, &nearest, sizeof bits);
  bits |= 1u;
  std::memcpy(&nearest, &bits, sizeof bits);
  return nearest;
}

/// A value stored as S: rounded once to nearest, ties to even (into a 16-bit S by Eigen's conversions from float; a
/// double goes through narrow_to_float_round_to_odd first, so it is not rounded twice; into float or double by the
/// cast), NaN kept NaN, overflow to infinity. A no-op when S is the value's type.
template <typename S, typename T>
EIGEN_ALWAYS_INLINE S narrow(const T& x) {
  if constexpr (std::is_same_v<S, T>)
    return x;
  else if constexpr (!is_half_width_v<S>)
    return static_cast<S>(x);  // float or double: one rounding (or none) by the cast
  else if constexpr (std::is_same_v<T, double>)
    return S(narrow_to_float_round_to_odd(x));
  else
    return S(static_cast<float>(x));
}

/// Converts n contiguous elements from `from` to `to` (widening exactly, or rounding to nearest even).
template <typename From, typename To>
void convert_row(const From* from, To* to, Index n) {
  for (Index j = 0; j < n; ++j) {
    if constexpr (is_half_width_v<To>)
      to[j] = narrow<To>(from[j]);
    else
      to[j] = widen<To>(from[j]);
  }
}

/// destination = source element by element, converted; shapes equal (checked by the callers).
template <typename From, typename To, int Rank>
void convert_view(const TensorView<const From, Rank>& source, const TensorView<To, Rank>& destination) {
  const Index n = source.dim(Rank - 1);
  for_each_row<Rank, 2>(source.shape(), {destination.strides(), source.strides()},
                        [&](const std::array<Index, 2>& at) { convert_row(source.data() + at[1], destination.data() + at[0], n); });
}

}  // namespace detail

/// \brief A contiguous copy of a tensor with its elements converted to `To`: float or double to bfloat16 or
/// float16 rounds to nearest, ties to even (overflow to infinity, NaN stays NaN); 16-bit to float or double is
/// exact; float to double exact, double to float rounds to nearest.
///
/// Shapes: x (any) -> a Tensor<To> of the same shape.
/// \code
/// Tensor<float, 4> k({1, 8, 1024, 128});
/// Tensor<bfloat16, 4> k16 = tensor_cast<bfloat16>(k);     // half the bytes
/// Tensor<float, 4> back = tensor_cast<float>(k16);        // k rounded to bfloat16, as floats
/// \endcode
template <typename To, typename X, typename = std::enable_if_t<detail::is_tensor<X>>>
Tensor<To, detail::tensor_traits<std::decay_t<X>>::rank> tensor_cast(const X& x) {
  using From = detail::scalar_of<X>;
  constexpr int Rank = detail::tensor_traits<std::decay_t<X>>::rank;
  static_assert(is_attention_element_v<From> && is_attention_element_v<To>,
                "selfattn::tensor_cast converts between float, double, bfloat16 and float16");
  const TensorView<const From, Rank> source = detail::const_view(x);
  Tensor<To, Rank> result(source.shape());
  if constexpr (is_half_width_v<From> && is_half_width_v<To> && !std::is_same_v<From, To>) {
    // bfloat16 <-> float16 through float: exact widening, one rounding.
    const Tensor<float, Rank> wide = tensor_cast<float>(source);
    detail::convert_view<float, To, Rank>(wide.view(), result.view());
  } else {
    detail::convert_view<From, To, Rank>(source, result.view());
  }
  return result;
}

}  // namespace selfattn
