// selfattn/detail/reference.hpp — the reference scaled dot-product attention: short, obvious, the spec.
//
// Every fast kernel is tested against this file. It materialises the (Lq, Lk) score matrix of one
// (batch, head) at a time and runs the three passes of softmax attention in plain sight.
#pragma once

#include <selfattn/detail/params.hpp>
#include <selfattn/detail/softmax.hpp>
#include <selfattn/tensor.hpp>

#include <array>
#include <cmath>
#include <limits>

namespace selfattn::detail {

/// The weight that multiplies v_j in o_i: P_ij, or P_ij * keep_ij / (1 - p) under dropout.
template <typename T>
T dropped_weight(const AttentionParams<T>& p, Index b, Index h, Index i, Index j, T probability) {
  if (!p.dropout.active()) return probability;
  return p.dropout.keep(b, h, i, j) ? probability * p.dropout.keep_scale() : T(0);
}

/// scale * Q K^T for one (b, h): the scores before soft-capping and the mask's terms.
template <typename T>
RowMajorMatrix<T> reference_dot_products(const AttentionParams<T>& p, Index b, Index h) {
  const auto q = as_matrix(p.q[b][h]);
  const auto k = as_matrix(p.k[b][p.kv_head(h)]);
  RowMajorMatrix<T> s(p.q_len(), p.k_len());
  s.noalias() = p.scale * (q * k.transpose());
  return s;
}

/// Pass 1 for one (b, h): S = cap(scale * Q K^T) + bias + ALiBi, with -inf wherever query i may not see key j;
/// cap(x) = c tanh(x / c) with soft-capping, else x. A score that is -inf (a -inf bias, say) counts as masked too.
template <typename T>
RowMajorMatrix<T> reference_scores(const AttentionParams<T>& p, Index b, Index h) {
  RowMajorMatrix<T> s = reference_dot_products(p, b, h);
  if (p.softcap != T(0)) s = s.unaryExpr([&](T x) { return softcapped(x, p.softcap); });
  for (Index i = 0; i < p.q_len(); ++i) {
    const RowMask<T> row = p.mask.row(b, h, i);
    for (Index j = 0; j < p.k_len(); ++j) s(i, j) = p.mask.score(row, b, h, i, j, s(i, j));
  }
  return s;
}

/// Pass 2 in place: S -> P = exp(S - m) / l row by row, returning lse = m + log l per row, by the rules of
/// softmax.hpp: masked entries exactly 0, and a row without any allowed key all zero with lse = -inf. A sink
/// logit (rule 6) joins every row's sum l and lse, and takes no column of P.
template <typename T>
Eigen::Matrix<T, Eigen::Dynamic, 1> reference_softmax(RowMajorMatrix<T>& s, T sink) {
  Eigen::Matrix<T, Eigen::Dynamic, 1> lse(s.rows());
  for (Index i = 0; i < s.rows(); ++i) {
    T m = -std::numeric_limits<T>::infinity();
    for (Index j = 0; j < s.cols(); ++j) m = std::max(m, s(i, j));
    const T shift = softmax_shift(m);
    T l = 0;
    for (Index j = 0; j < s.cols(); ++j) {
      s(i, j) = exp_or_zero(s(i, j), shift);
      l += s(i, j);
    }
    const FinishedRow<T> row = finish_row(m, l, T(1), sink);
    for (Index j = 0; j < s.cols(); ++j) s(i, j) = row.output(s(i, j));
    lse(i) = row.lse;
  }
  return lse;
}

/// The reference forward: three passes per (batch, head).
///   1. s_ij = cap(scale * q_i . k_j) + bias_ij - slope_h |i + off - j|, or -inf where masked
///   2. P_ij = exp(s_ij - m_i) / l_i with m_i = max_j s_ij, l_i = sum_j exp(s_ij - m_i) (+ exp(sink_h - m_i) with
///      a sink, m_i then the maximum of both);  lse_i = m_i + log l_i
///   3. o_i = sum_j P_ij * keep_ij / (1 - p) * v_j over the j with a non-zero weight: masked (and dropped)
///      keys are skipped, not multiplied by 0, so a NaN in their values cannot reach o_i
template <typename T>
void reference_forward(const AttentionParams<T>& p, const ForwardOutputs<T>& result) {
  for (Index b = 0; b < p.batch(); ++b)
    for (Index h = 0; h < p.heads(); ++h) {
      RowMajorMatrix<T> probabilities = reference_scores(p, b, h);                       // pass 1
      const Eigen::Matrix<T, Eigen::Dynamic, 1> lse = reference_softmax(probabilities, p.sink(h));  // pass 2
      for (Index i = 0; i < p.q_len(); ++i) result.lse(b, h, i) = lse(i);
      if (result.weights.data()) as_matrix(result.weights[b][h]) = probabilities;

      // Pass 3. V is copied to contiguous rows first: in a head-split view its rows sit E elements apart,
      // and this loop visits them Lq times (measured: 2x slower at N = 2048 without the copy).
      const RowMajorMatrix<T> v = as_matrix(p.v[b][p.kv_head(h)]);
      auto out = as_matrix(result.out[b][h]);
      out.setZero();
      for (Index i = 0; i < p.q_len(); ++i)
        for (Index j = 0; j < p.k_len(); ++j) {
          const T weight = dropped_weight(p, b, h, i, j, probabilities(i, j));
          if (weight != T(0)) out.row(i) += weight * v.row(j);
        }
    }
}

/// The reference backward: the forward's passes in reverse, per (batch, head), with P recomputed from
/// the saved lse instead of stored. Writes dq; accumulates dk, dv over the query heads sharing a key/value
/// head, and dbias over its broadcast dimensions.
template <typename T>
void reference_backward(const AttentionParams<T>& p, const BackwardTensors<T>& g) {
  constexpr T minus_infinity = -std::numeric_limits<T>::infinity();
  for (const TensorView<T, 4>& accumulated : {g.dk, g.dv, g.dbias}) set_zero(accumulated);
  // dbias is written with broadcasting: a gradient summed over every dimension the bias was broadcast along.
  const Broadcast4<T> dbias(g.dbias);

  for (Index b = 0; b < p.batch(); ++b)
    for (Index h = 0; h < p.heads(); ++h) {
      const Index hk = p.kv_head(h);
      // Contiguous copies, as in the forward's pass 3: the loops below revisit these rows many times.
      const RowMajorMatrix<T> q = as_matrix(p.q[b][h]);
      const RowMajorMatrix<T> k = as_matrix(p.k[b][hk]);
      const RowMajorMatrix<T> v = as_matrix(p.v[b][hk]);
      const auto out = as_matrix(g.out[b][h]);
      const auto dout = as_matrix(g.dout[b][h]);
      auto dq = as_matrix(g.dq[b][h]);
      auto dk = as_matrix(g.dk[b][hk]);
      auto dv = as_matrix(g.dv[b][hk]);
      dq.setZero();

      // Pass 1 again: s_ij = cap(scale * q_i . k_j) + bias_ij - slope_h |i + off - j|, or -inf where masked.
      const RowMajorMatrix<T> s = reference_scores(p, b, h);
      // The cap's derivative, d cap(x) / dx = 1 - tanh^2(x / c), at x = scale * q_i . k_j.
      RowMajorMatrix<T> cap_slope;
      if (p.softcap != T(0))
        cap_slope = reference_dot_products(p, b, h).unaryExpr([&](T x) {
          const T t = std::tanh(x / p.softcap);
          return T(1) - t * t;
        });
      for (Index i = 0; i < p.q_len(); ++i) {
        // Pass 2 from the saved lse: P_ij = exp(s_ij - lse_i), which equals exp(s_ij - m_i) / l_i.
        const T lse = element(g.lse, b, h, i);
        // D_i = rowsum(dO_i * O_i) = sum_j P_ij dP_ij: the softmax Jacobian's rank-one part, O(Dv) per row.
        const T d_i = dout.row(i).dot(out.row(i));
        for (Index j = 0; j < p.k_len(); ++j) {
          if (s(i, j) == minus_infinity) continue;  // masked: no gradient, and NaN in k_j / v_j stays out
          const T probability = std::exp(s(i, j) - lse);
          if (probability == T(0)) continue;
          // Pass 3, o_i = sum_j W_ij v_j with W_ij = P_ij keep_ij / (1 - p):
          //   dv_j += W_ij dO_i;   dP_ij = (dO_i . v_j) * keep_ij / (1 - p)
          const T weight = dropped_weight(p, b, h, i, j, probability);
          if (weight != T(0)) dv.row(j) += weight * dout.row(i);
          const T d_probability = dropped_weight(p, b, h, i, j, dout.row(i).dot(v.row(j)));
          // Softmax: dS_ij = P_ij (dP_ij - D_i)
          const T d_score = probability * (d_probability - d_i);
          // Scores: dbias_ij += dS_ij;  through the cap, dX_ij = dS_ij cap'(x_ij);  dq_i += scale dX_ij k_j;
          // dk_j += scale dX_ij q_i
          if (dbias.present()) dbias(b, h, i, j) += d_score;
          const T d_dot = p.softcap != T(0) ? d_score * cap_slope(i, j) : d_score;
          dq.row(i) += (p.scale * d_dot) * k.row(j);
          dk.row(j) += (p.scale * d_dot) * q.row(i);
        }
      }
    }
}

}  // namespace selfattn::detail
