// selfattn/detail/mask.hpp — the one place that decides "may query i see key j" and what is added to s_ij.
// No public names: everything here is internal (`selfattn::detail`), used by every kernel.
//
// Structural masks (causal, sliding window, key lengths) reduce to one contiguous key range per (batch, query
// row); the boolean `allowed` mask and the bias are per element; ALiBi is a per-row slope times the distance to
// the row's bottom-right diagonal. MaskParams::row gives every kernel the same per-row description (RowMask),
// and MaskParams::score the final score of one pair; the packet forms below apply the same rules to a packet of
// keys or of rows. Rows and columns: i = query row, j = key column, off = Lk - Lq (or the sequence's own key length
// minus Lq, diagonal_per_sequence), c = i + off (the diagonal).
#pragma once

#include <selfattn/detail/simd.hpp>
#include <selfattn/options.hpp>
#include <selfattn/tensor.hpp>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <limits>
#include <type_traits>

namespace selfattn::detail {

/// The broadcast rule (NumPy's): a dimension of extent 1 repeats, so its stride is read as 0.
template <typename T, int Rank>
std::array<Index, Rank> broadcast_strides(const TensorView<T, Rank>& view) {
  std::array<Index, Rank> strides{};
  for (int d = 0; d < Rank; ++d) strides[static_cast<std::size_t>(d)] = view.dim(d) == 1 ? 0 : view.stride(d);
  return strides;
}

/// A rank-4 tensor read (or, for a non-const T, accumulated into) with broadcasting: (b, h, i, j) addresses the
/// element its broadcast shape maps them to. Absent when data is null.
template <typename T>
struct Broadcast4 {
  T* data = nullptr;
  std::array<Index, 4> strides{};

  Broadcast4() = default;
  explicit Broadcast4(const TensorView<T, 4>& view) : data(view.data()), strides(broadcast_strides(view)) {}
  /// A read-only reader from a writable one.
  template <typename U, typename = std::enable_if_t<std::is_same_v<const U, T> && !std::is_same_v<U, T>>>
  Broadcast4(const Broadcast4<U>& other) : data(other.data), strides(other.strides) {}  // NOLINT: const adds only
  bool present() const { return data != nullptr; }
  T& operator()(Index b, Index h, Index i, Index j) const {
    return data[b * strides[0] + h * strides[1] + i * strides[2] + j * strides[3]];
  }
};

/// Keys [begin, end) a query row may see after the structural masks; empty when begin == end.
struct KeyRange {
  Index begin = 0;
  Index end = 0;
  bool empty() const { return begin >= end; }
  bool contains(Index j) const { return begin <= j && j < end; }
};

/// What every kernel needs to know about one query row's mask.
template <typename T>
struct RowMask {
  KeyRange keys;               ///< the keys the structural masks leave
  T slope = T(0);              ///< the ALiBi slope of the row's head (0 without ALiBi)
  T diagonal = T(0);           ///< c = i + Lk - Lq, the row's bottom-right diagonal, as T (ALiBi's origin)
  bool element_masks = false;  ///< `allowed` or a bias: per-element work beyond the range and ALiBi
};

/// ALiBi's term: s - slope * |c - j|. One expression for scalars and packets (the distance is exact in T: an
/// integer below 2^24 in float).
template <typename P>
EIGEN_STRONG_INLINE P minus_alibi(const P& score, const P& slope, const P& diagonal, const P& key) {
  using namespace Eigen::internal;
  return psub(score, pmul(slope, pabs(psub(diagonal, key))));
}

/// The mask description kernels receive: filled from validated options, never throws.
template <typename T>
struct MaskParams {
  Index q_len = 0;                      // Lq
  Index k_len = 0;                      // Lk
  Causal causal = Causal::none;
  const Index* key_lengths = nullptr;   // B entries, or null: all Lk keys valid
  Index window_left = -1;               // -1 = unbounded
  Index window_right = -1;
  Broadcast4<const bool> allowed;       // absent, or true = may attend
  Broadcast4<const T> bias;             // absent, or added to the scores
  const T* alibi_slopes = nullptr;      // H entries, or null
  bool diagonal_per_sequence = false;   // off = key_lengths[b] - Lq: each sequence's rows are its last Lq keys (paged)

  /// off of batch b: Lk - Lq, or key_lengths[b] - Lq when each sequence ends at its own length.
  Index offset(Index b) const { return (diagonal_per_sequence ? key_lengths[b] : k_len) - q_len; }

  /// Keys not excluded by key lengths, causality or the window, for batch b and query row i.
  KeyRange key_range(Index b, Index i) const {
    const Index c = i + offset(b);  // bottom-right diagonal
    Index begin = 0;
    Index end = key_lengths ? key_lengths[b] : k_len;
    if (causal == Causal::top_left) end = std::min(end, i + 1);          // j <= i
    if (causal == Causal::bottom_right) end = std::min(end, c + 1);      // j <= i + off
    if (window_left >= 0) begin = std::max(begin, c - window_left);     // c - window_left <= j
    if (window_right >= 0) end = std::min(end, c + window_right + 1);   // j <= c + window_right
    begin = std::clamp<Index>(begin, 0, k_len);
    end = std::clamp<Index>(end, begin, k_len);
    return {begin, end};
  }

  /// Whether a per-element tensor (`allowed`, bias) applies: kernels skip the per-element pass without one.
  bool has_element_masks() const { return allowed.present() || bias.present(); }
  bool has_alibi() const { return alibi_slopes != nullptr; }

  /// The description of query row i of head h, batch b: its key range, ALiBi slope and diagonal.
  RowMask<T> row(Index b, Index h, Index i) const {
    return {key_range(b, i), has_alibi() ? alibi_slopes[h] : T(0), static_cast<T>(i + offset(b)), has_element_masks()};
  }

  /// The final score of the pair (i, j) of row `r` = row(b, h, i), given s = scale * q_i . k_j:
  ///   s + bias_ij - slope_h |c - j|   where j is in the row's range and `allowed`,   -inf elsewhere.
  /// A masked value is selected, never computed, so a NaN in a masked key does not survive.
  T score(const RowMask<T>& r, Index b, Index h, Index i, Index j, T s) const {
    if (!r.keys.contains(j) || (allowed.present() && !allowed(b, h, i, j))) return -std::numeric_limits<T>::infinity();
    if (bias.present()) s += bias(b, h, i, j);
    if (has_alibi()) s = minus_alibi(s, r.slope, r.diagonal, static_cast<T>(j));
    return s;
  }
};

}  // namespace selfattn::detail
