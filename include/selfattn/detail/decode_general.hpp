// selfattn/detail/decode_general.hpp — the general decode path: any mask, bias, ALiBi or dropout, each chunk's two
// products through Eigen. The fast paths (kernels/decode_grouped.inc, kernels/decode_streaming.inc) take the calls
// without per-element masks or dropout; this one takes the rest. Chunks and their merge: kernels/decode_driver.inc.
#pragma once

#include <selfattn/detail/kernels.hpp>
#include <selfattn/detail/decode_rows.hpp>
#include <selfattn/detail/mask.hpp>
#include <selfattn/detail/params.hpp>
#include <selfattn/detail/softmax.hpp>
#include <selfattn/half_precision.hpp>
#include <selfattn/tensor.hpp>

#include <Eigen/Core>

#include <type_traits>

namespace selfattn::detail {

/// The general path as the generic level's driver (kernels/decode_driver.inc) runs it. Partials are row-major:
/// acc (R, Dv). KV: the storage type of keys and values; 16-bit ones are widened a chunk at a time into the thread's scratch before the products.
template <typename T, typename KV = T>
struct GeneralDecode {
  using Queries = RowMajorMatrix<T>;  // (R, D), the rows' queries (unscaled, as the reference multiplies)
  static constexpr bool widens = !std::is_same_v<KV, T>;

  static Index lanes(Index rows) { return rows; }
  static constexpr bool lane_major = false;
  /// The scores (R x chunk) and, for a 16-bit KV, the chunk's keys and values widened (chunk x (D + Dv)).
  static Index scratch_size(Index rows, Index head_dim, Index value_dim) {
    return rows * decode_chunk + (widens ? decode_chunk * (head_dim + value_dim) : 0);
  }

  /// Lays out the rows' queries in q; a q of the same size as the last call's is not reallocated.
  static void prepare(const AttentionParams<T, KV>& p, const DecodeRows<T>& rows, Queries& q) {
    q.resize(rows.rows(), p.head_dim());
    for (Index r = 0; r < rows.rows(); ++r) q.row(r) = as_vector(p.q[rows.batch][rows.head(r)][rows.query_row(r)]);
  }

  /// One chunk, in the reference's passes:
  ///   1. s_rj = scale * q_r . k_j (one GEMM), then the final scores of MaskParams::score where masks apply
  ///   2. p_rj = exp(s_rj - m_r) by softmax_row: the partial's max and sum (before dropout)
  ///   3. acc_r = sum_j p_rj keep_rj v_j: one GEMM when nothing is masked or dropped; otherwise row by row,
  ///      skipping zero weights (a NaN value at a masked key must not reach the output)
  static void chunk(const Queries& q, const DecodeRows<T>& rows, const AttentionParams<T, KV>& p,
                    const DecodeChunk<KV>& chunk, Index value_dim, T* scratch, const DecodePartial<T>& part) {
    const Index n = chunk.hi - chunk.lo, head_dim = p.head_dim(), b = rows.batch;
    const TensorView<const KV, 2> keys(chunk.k + chunk.lo * chunk.ldk, {n, head_dim}, {chunk.ldk, 1});
    const TensorView<const KV, 2> values(chunk.v + chunk.lo * chunk.ldv, {n, value_dim}, {chunk.ldv, 1});
    TensorView<const T, 2> k_view, v_view;
    if constexpr (widens) {  // the chunk's keys and values as T, after the scores in scratch
      const TensorView<T, 2> k_wide(scratch + rows.rows() * decode_chunk, {n, head_dim});
      const TensorView<T, 2> v_wide(k_wide.data() + n * head_dim, {n, value_dim});
      convert_view<KV, T, 2>(keys, k_wide);
      convert_view<KV, T, 2>(values, v_wide);
      k_view = k_wide;
      v_view = v_wide;
    } else {
      k_view = keys;
      v_view = values;
    }
    const auto k = as_matrix(k_view);
    const auto v = as_matrix(v_view);
    Eigen::Map<RowMajorMatrix<T>> s(scratch, rows.rows(), n);
    s.noalias() = p.scale * (q * k.transpose());  // 1.
    const bool per_element = chunk.masked || p.mask.has_element_masks() || p.mask.has_alibi();
    for (Index r = 0; r < rows.rows(); ++r) {
      const Index h = rows.head(r), i = rows.query_row(r);
      T* s_row = scratch + r * n;
      if (per_element)
        for (Index c = 0; c < n; ++c)
          s_row[c] = p.mask.score(rows.masks[static_cast<std::size_t>(r)], b, h, i, chunk.lo + c, s_row[c]);
      part.max[r] = micro::softmax_row(s_row, n, part.sum + r);  // 2.
      if (p.dropout.active())  // after the sum: it is before dropout; the values see the kept probabilities
        for (Index c = 0; c < n; ++c)
          if (!p.dropout.keep(b, h, i, chunk.lo + c)) s_row[c] = T(0);
    }
    Eigen::Map<RowMajorMatrix<T>> acc(part.acc, rows.rows(), value_dim);  // 3.
    if (!per_element && !p.dropout.active()) {
      acc.noalias() = s * v;
      return;
    }
    acc.setZero();
    for (Index r = 0; r < rows.rows(); ++r)
      for (Index c = 0; c < n; ++c)
        if (s(r, c) != T(0)) acc.row(r) += s(r, c) * v.row(c);
  }
};

}  // namespace selfattn::detail
