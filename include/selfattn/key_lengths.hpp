/// \file
/// KeyLengths: the type of `AttentionOptions::key_lengths`, a `std::vector<Index>` that also takes a
/// `std::vector` of any other integer type.
#pragma once

#include <selfattn/tensor.hpp>

#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace selfattn {

/// \brief Key lengths per batch (`AttentionOptions::key_lengths`): a `std::vector<Index>` that also takes a
/// `std::vector` of any other integer type.
///
/// Everything of `std::vector<Index>` works (`= {8, 5, 1}`, `empty()`, `size()`, `data()`, `[b]`, `push_back`,
/// passing it as a `const std::vector<Index>&`), and a `std::vector<int>`, `<std::int32_t>`, `<std::size_t>`...
/// converts, so lengths kept as `int` need no copy loop. Values are checked where they are used (each in
/// [0, Lk], by the attention call, which names `opts.key_lengths[b]`); a value that does not fit in `Index`
/// throws std::invalid_argument here.
///
/// Shapes: B entries, one per batch.
/// \code
/// std::vector<int> lengths{8, 5, 1};
/// opts.key_lengths = lengths;             // or {8, 5, 1}, or a std::vector<Index>
/// \endcode
class KeyLengths : public std::vector<Index> {
 public:
  using std::vector<Index>::vector;  // every constructor of std::vector<Index>, the braced list among them

  KeyLengths() = default;  ///< empty: every key is valid
  /// Takes a `std::vector<Index>` (moved when given an rvalue).
  KeyLengths(std::vector<Index> lengths)  // NOLINT(google-explicit-constructor): implicit on purpose
      : std::vector<Index>(std::move(lengths)) {}
  /// Converts a `std::vector` of another integer type; throws std::invalid_argument for a value outside `Index`.
  template <typename I, typename = std::enable_if_t<std::is_integral_v<I> && !std::is_same_v<I, bool> &&
                                                    !std::is_same_v<I, Index>>>
  KeyLengths(const std::vector<I>& lengths) {  // NOLINT(google-explicit-constructor): implicit on purpose
    reserve(lengths.size());
    for (const I length : lengths) {
      if (!fits_in_index(length))
        throw std::invalid_argument("selfattn::KeyLengths: key length " + std::to_string(length) +
                                    " does not fit in selfattn::Index");
      push_back(static_cast<Index>(length));
    }
  }

 private:
  template <typename I>
  static constexpr bool fits_in_index(I value) {
    (void)value;  // unused when every I fits
    constexpr Index max = std::numeric_limits<Index>::max();
    if constexpr (std::is_signed_v<I>) {
      if constexpr (sizeof(I) <= sizeof(Index)) return true;
      else return value >= static_cast<I>(std::numeric_limits<Index>::min()) && value <= static_cast<I>(max);
    } else {
      if constexpr (sizeof(I) < sizeof(Index)) return true;
      else return value <= static_cast<I>(max);
    }
  }
};

}  // namespace selfattn
