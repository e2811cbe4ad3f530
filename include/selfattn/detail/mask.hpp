/// \file
/// The one place that decides "may query i see key j" and what is added to s_ij.
/// No public names: everything here is internal (`selfattn::detail`), used by the kernels.
///
/// Reference and fused kernels both ask this file, so a mask can never disagree between them.
/// Structural masks (causal, sliding window, key lengths) reduce to one contiguous key range per
/// (batch, query row); the boolean `allowed` mask and the additive terms (bias, ALiBi) are per element.
/// Rows and columns: i = query row, j = key column, off = Lk - Lq, c = i + off (the bottom-right diagonal).
#pragma once

#include <selfattn/options.hpp>
#include <selfattn/tensor.hpp>

#include <algorithm>
#include <array>
#include <cstdlib>

namespace selfattn::detail {

/// A rank-4 tensor read with NumPy broadcasting: extent-1 dimensions get stride 0. Absent when data is null.
template <typename T>
struct Broadcast4 {
  const T* data = nullptr;
  std::array<Index, 4> strides{};

  Broadcast4() = default;
  explicit Broadcast4(const TensorView<const T, 4>& view) : data(view.data()) {
    for (int d = 0; d < 4; ++d) strides[static_cast<std::size_t>(d)] = view.dim(d) == 1 ? 0 : view.stride(d);
  }
  bool present() const { return data != nullptr; }
  const T& operator()(Index b, Index h, Index i, Index j) const {
    return data[b * strides[0] + h * strides[1] + i * strides[2] + j * strides[3]];
  }
};

/// Keys [begin, end) a query row may see after the structural masks; empty when begin == end.
struct KeyRange {
  Index begin = 0;
  Index end = 0;
  bool empty() const { return begin >= end; }
};

/// The mask description kernels receive: filled from validated options, never throws.
template <typename T>
struct MaskParams {
  Index q_len = 0;                      // Lq
  Index k_len = 0;                      // Lk
  Causal causal = Causal::none;
  const Index* key_lengths = nullptr;   // B entries, or null: all Lk keys valid
  Index window_left = -1;               // -1 = unbounded
  Index window_right = -1;
  Broadcast4<bool> allowed;             // absent, or true = may attend
  Broadcast4<T> bias;                   // absent, or added to the scores
  const T* alibi_slopes = nullptr;      // H entries, or null

  Index offset() const { return k_len - q_len; }

  /// Keys not excluded by key lengths, causality or the window, for batch b and query row i.
  KeyRange key_range(Index b, Index i) const {
    const Index c = i + offset();  // bottom-right diagonal
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

  /// Per-element masks beyond the key range: only the boolean `allowed` tensor.
  bool element_allowed(Index b, Index h, Index i, Index j) const { return !allowed.present() || allowed(b, h, i, j); }

  /// Whether the score needs an additive term at all (lets kernels skip the per-element call).
  bool has_score_offset() const { return bias.present() || alibi_slopes != nullptr; }

  /// Additive term of s_ij: bias_ij - slope_h * |i + off - j|.
  T score_offset(Index b, Index h, Index i, Index j) const {
    T add = bias.present() ? bias(b, h, i, j) : T(0);
    if (alibi_slopes) add -= alibi_slopes[h] * static_cast<T>(std::abs(i + offset() - j));
    return add;
  }
};

}  // namespace selfattn::detail
