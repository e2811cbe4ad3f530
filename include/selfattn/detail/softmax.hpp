// selfattn/detail/softmax.hpp — the softmax rules every kernel follows, written once: the exponential of a
// masked score, the shift of a row that has seen no key, the online rescale, the merge of two partial results
// over disjoint keys, and the finish of a row (output and lse). docs/numerics.md states the same rules for users.
//
//   1. Masked scores are -inf; their probabilities are selected to exactly 0, never computed
//      (Eigen's vectorised exp(-inf) is not 0).                                              exp_or_zero
//   2. A row's terms are taken against shift = m, its maximum score, or against 0 while m = -inf (no key
//      yet), so exp(-inf - -inf) = NaN never happens.                                        softmax_shift
//   3. A row is empty (no allowed key) exactly when its sum of probabilities is 0: its output is 0 and its
//      lse -inf, never 0 / 0. Otherwise lse = shift + log l and the output is acc / l.       finish_row
//   4. NaN: a NaN (or +inf) score at an allowed key makes the row's sum NaN, hence its output and lse NaN.
//      The maximum may or may not hold the NaN (SIMD max instructions drop it); the sum always carries it,
//      which is why rule 3 looks at the sum and why merges add the sums of every side.
//   5. Partials over disjoint keys merge by their maxima: m = max(m_a, m_b), each side weighted by
//      exp(m_side - shift(m)) (0 for a side that saw no key); sums add, and accumulated values add except
//      from a side of weight 0 (0 * inf would be NaN).                                       merge_partial
//   6. A sink logit joins the row's softmax with no value: the finished row is merged (rule 5) with the partial
//      (max = sink, sum = 1, acc = 0) before rule 3. A row without any allowed key then has output 0 and
//      lse = sink; a sink of -inf is no sink.                                                finish_row
//
// Logit soft-capping, s = c tanh(s / c), is the scalar softcapped here and a packet function in the kernels.
#pragma once

#include <selfattn/tensor.hpp>

#include <algorithm>
#include <cmath>
#include <limits>

namespace selfattn::detail {

/// The score of a masked pair (rule 1), and the maximum and lse of a row that has seen no key.
template <typename T>
inline constexpr T minus_infinity = -std::numeric_limits<T>::infinity();

/// Rule 2: the shift of a row whose maximum so far is `max`.
template <typename T>
T softmax_shift(T max) {
  return max == -std::numeric_limits<T>::infinity() ? T(0) : max;
}

/// Rule 1: exp(s - shift), exactly 0 for a masked score s = -inf.
template <typename T>
T exp_or_zero(T s, T shift) {
  return s == -std::numeric_limits<T>::infinity() ? T(0) : std::exp(s - shift);
}

/// lse and the output factor of a finished row (rule 3).
template <typename T>
struct FinishedRow {
  T lse;     ///< log sum_j exp(s_j), or -inf for an empty row
  T factor;  ///< out_scale / l: what an accumulated value is multiplied by; 0 for an empty row

  /// The output from an accumulated value: acc * factor, and exactly 0 in an empty row (whatever acc holds).
  T output(T acc) const { return factor == T(0) ? T(0) : acc * factor; }
};

/// Rule 3: the end of every softmax, for a row with maximum `max` and sum l = sum_j exp(s_j - softmax_shift(max)).
/// `out_scale` multiplies the outputs (dropout's 1 / (1 - p)).
template <typename T>
FinishedRow<T> finish_row(T max, T sum, T out_scale = T(1)) {
  if (sum == T(0)) return {-std::numeric_limits<T>::infinity(), T(0)};
  return {softmax_shift(max) + std::log(sum), out_scale / sum};
}

/// The factors of rule 5 by which two partials' accumulated values are weighted.
template <typename T>
struct MergeWeights {
  T a;  ///< exp(m_a - shift(m)), 0 for a side that saw no key
  T b;  ///< exp(m_b - shift(m))

  /// A merged value: w_a x_a + w_b x_b, a side of weight 0 skipped (0 * inf would be NaN).
  T value(T x_a, T x_b) const {
    if (b == T(0)) return a * x_a;
    if (a == T(0)) return b * x_b;
    return a * x_a + b * x_b;
  }
};

/// Rule 5 for one row of two unnormalised partials over disjoint keys, each a maximum m and a sum
/// l = sum_j exp(s_j - shift(m)): (max_a, sum_a) becomes the merged pair; returns the weights of the values.
template <typename T>
MergeWeights<T> merge_partial(T& max_a, T& sum_a, T max_b, T sum_b) {
  const T max = std::max(max_a, max_b);
  const T shift = softmax_shift(max);
  const MergeWeights<T> weights{exp_or_zero(max_a, shift), exp_or_zero(max_b, shift)};
  max_a = max;
  sum_a = weights.a * sum_a + weights.b * sum_b;  // always both: a NaN sum must carry (rule 4)
  return weights;
}

/// Rule 6: finish_row for a row whose softmax also holds the logit `sink` (no value): merged with the partial
/// (sink, 1) first, so the accumulated values, taken against the old maximum, are weighted by that merge's a.
template <typename T>
FinishedRow<T> finish_row(T max, T sum, T out_scale, T sink) {
  if (sink == -std::numeric_limits<T>::infinity()) return finish_row(max, sum, out_scale);
  const MergeWeights<T> weights = merge_partial(max, sum, sink, T(1));
  // sum >= 1 now (or NaN): lse = shift + log l; a row that saw no key has weights.a = 0, hence output 0.
  return {softmax_shift(max) + std::log(sum), weights.a * out_scale / sum};
}

/// Logit soft-capping of one score: c tanh(s / c) (Gemma 2), bounded by c; s unchanged for c = 0 (off).
template <typename T>
T softcapped(T s, T c) {
  return c == T(0) ? s : c * std::tanh(s / c);
}

}  // namespace selfattn::detail
