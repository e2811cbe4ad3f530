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
#pragma once

#include <selfattn/detail/simd.hpp>
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

namespace micro {

/// Rule 2 on a packet of rows.
template <typename T>
EIGEN_STRONG_INLINE Packet<T> softmax_shift(const Packet<T>& max) {
  using P = Packet<T>;
  const P minus_infinity = Eigen::internal::pset1<P>(-std::numeric_limits<T>::infinity());
  return Eigen::internal::pselect(Eigen::internal::pcmp_eq(max, minus_infinity), Eigen::internal::pset1<P>(T(0)), max);
}

/// Rule 1 on a packet: exp(s - shift) where s is not -inf, exactly 0 where it is.
template <typename T>
EIGEN_STRONG_INLINE Packet<T> exp_or_zero(const Packet<T>& s, const Packet<T>& shift) {
  using P = Packet<T>;
  const P minus_infinity = Eigen::internal::pset1<P>(-std::numeric_limits<T>::infinity());
  const P masked = Eigen::internal::pcmp_eq(s, minus_infinity);
  return Eigen::internal::pselect(masked, Eigen::internal::pset1<P>(T(0)),
                                  exp_packet<T>(Eigen::internal::psub(s, shift)));
}

/// The online softmax's step on a packet of rows (FlashAttention): the maximum raised to include `candidate`,
/// the shift the new terms are taken against, and alpha, the factor that rescales what was accumulated against
/// the old maximum (rule 5 with the new terms already taken against the new shift).
template <typename T>
struct Rescale {
  Packet<T> max;    ///< m' = max(m, candidate)
  Packet<T> shift;  ///< softmax_shift(m')
  Packet<T> alpha;  ///< exp(m - shift), 0 while m = -inf
};

template <typename T>
EIGEN_STRONG_INLINE Rescale<T> raise_max(const Packet<T>& max, const Packet<T>& candidate) {
  const Packet<T> raised = Eigen::internal::pmax(max, candidate);
  const Packet<T> shift = softmax_shift<T>(raised);
  return {raised, shift, exp_or_zero<T>(max, shift)};
}

/// Rule 5 on packets of rows (or of one row's values under broadcast weights): the weights of two partials.
template <typename T>
struct MergeWeights {
  Packet<T> a;  ///< exp(m_a - shift(m)), 0 for a side that saw no key
  Packet<T> b;  ///< exp(m_b - shift(m))

  /// Merged values: w_a x_a + w_b x_b, a side of weight 0 skipped (0 * inf would be NaN).
  EIGEN_STRONG_INLINE Packet<T> value(const Packet<T>& x_a, const Packet<T>& x_b) const {
    using namespace Eigen::internal;
    const Packet<T> zero = pset1<Packet<T>>(T(0)), from_a = pmul(a, x_a), from_b = pmul(b, x_b);
    return pselect(pcmp_eq(b, zero), from_a, pselect(pcmp_eq(a, zero), from_b, padd(from_a, from_b)));
  }
};

/// Rule 5 for a packet of rows, as detail::merge_partial for one: (max_a, sum_a) becomes the merged pair.
template <typename T>
EIGEN_STRONG_INLINE MergeWeights<T> merge_partial(Packet<T>& max_a, Packet<T>& sum_a, const Packet<T>& max_b,
                                                  const Packet<T>& sum_b) {
  using namespace Eigen::internal;
  const Packet<T> max = pmax(max_a, max_b);
  const Packet<T> shift = softmax_shift<T>(max);
  const MergeWeights<T> weights{exp_or_zero<T>(max_a, shift), exp_or_zero<T>(max_b, shift)};
  max_a = max;
  sum_a = padd(pmul(weights.a, sum_a), pmul(weights.b, sum_b));  // always both: a NaN sum must carry (rule 4)
  return weights;
}

/// The softmax of one row of n scores in place, unnormalised: s_j := exp_or_zero(s_j, shift) (rules 1, 2).
/// Returns the row's maximum; *sum receives l = sum_j s_j.
template <typename T>
T softmax_row(T* s, Index n, T* sum) {
  using namespace Eigen::internal;
  using P = Packet<T>;
  constexpr Index ps = packet_size<T>;
  constexpr T minus_infinity = -std::numeric_limits<T>::infinity();
  P max_packet = pset1<P>(minus_infinity);
  Index j = 0;
  for (; j + ps <= n; j += ps) max_packet = pmax(max_packet, ploadu<P>(s + j));
  T lanes[ps];
  pstoreu(lanes, max_packet);
  T max = minus_infinity;
  for (Index lane = 0; lane < ps; ++lane) max = std::max(max, lanes[lane]);
  for (; j < n; ++j) max = std::max(max, s[j]);

  const T shift = detail::softmax_shift(max);
  const P shift_packet = pset1<P>(shift);
  P sum_packet = pset1<P>(T(0));
  for (j = 0; j + ps <= n; j += ps) {
    const P probability = exp_or_zero<T>(ploadu<P>(s + j), shift_packet);
    sum_packet = padd(sum_packet, probability);
    pstoreu(s + j, probability);
  }
  pstoreu(lanes, sum_packet);
  T total = T(0);
  for (Index lane = 0; lane < ps; ++lane) total += lanes[lane];
  for (; j < n; ++j) {
    s[j] = detail::exp_or_zero(s[j], shift);
    total += s[j];
  }
  *sum = total;
  return max;
}

}  // namespace micro

}  // namespace selfattn::detail
