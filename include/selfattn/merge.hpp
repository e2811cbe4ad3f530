/// \file
/// AttentionPartial and merge_attention_partials: attention over a union of disjoint key sets from the results
/// over each set, merged by their log-sum-exps. The rule is softmax.hpp's, the one the decode kernel merges its
/// chunks with; docs/numerics.md states it.
#pragma once

#include <selfattn/detail/softmax.hpp>
#include <selfattn/errors.hpp>
#include <selfattn/tensor.hpp>

#include <limits>
#include <type_traits>

namespace selfattn {

/// \brief An attention result over some set of keys: out (B, H, Lq, Dv) and its log-sum-exp lse (B, H, Lq).
template <typename T>
struct AttentionPartial {
  Tensor<T, 4> out;  ///< (B, H, Lq, Dv): attention output over the key set
  Tensor<T, 3> lse;  ///< (B, H, Lq): log-sum-exp of the scores over the allowed keys; -inf when none
};

namespace detail {

/// merge_attention_partials on views of one element type.
template <typename T>
AttentionPartial<T> merge_attention_partials_views(const TensorView<const T, 4>& oa, const TensorView<const T, 3>& la,
                                                   const TensorView<const T, 4>& ob, const TensorView<const T, 3>& lb) {
  const char* fn = "merge_attention_partials";
  check_shape<4>(fn, "out_b", ob.shape(), oa.shape());
  check_shape<3>(fn, "lse_a", la.shape(), {oa.dim(0), oa.dim(1), oa.dim(2)});
  check_shape<3>(fn, "lse_b", lb.shape(), {oa.dim(0), oa.dim(1), oa.dim(2)});
  AttentionPartial<T> merged{Tensor<T, 4>(oa.shape()), Tensor<T, 3>(la.shape())};
  const Index value_dim = oa.dim(3);
  for (Index b = 0; b < oa.dim(0); ++b)
    for (Index h = 0; h < oa.dim(1); ++h)
      for (Index i = 0; i < oa.dim(2); ++i) {
        // A normalised result is a partial with maximum lse and sum 1 (0 when it saw no key): softmax.hpp's
        // merge (rule 5) and finish (rule 3), as inside the decode kernel.
        T max = la(b, h, i), sum = max == -std::numeric_limits<T>::infinity() ? T(0) : T(1);
        const T lse_b = lb(b, h, i);
        const MergeWeights<T> weights =
            merge_partial(max, sum, lse_b, lse_b == -std::numeric_limits<T>::infinity() ? T(0) : T(1));
        const FinishedRow<T> finished = finish_row(max, sum);
        for (Index e = 0; e < value_dim; ++e)
          merged.out(b, h, i, e) = finished.output(weights.value(oa(b, h, i, e), ob(b, h, i, e)));
        merged.lse(b, h, i) = finished.lse;
      }
  return merged;
}

}  // namespace detail

/// \brief Merges two attention results over disjoint key sets of the same queries into the result over
/// their union: lse = log(e^lse_a + e^lse_b), out = e^(lse_a - lse) out_a + e^(lse_b - lse) out_b.
///
/// The building block for splitting attention over keys: across threads (the decode kernel does this),
/// across processes or machines, or over a cache kept in pieces. A side with lse = -inf saw no allowed
/// key and contributes nothing. Throws ShapeError naming `out_b`, `lse_a` or `lse_b` when shapes differ.
///
/// Shapes: out_a, out_b (B, H, Lq, Dv); lse_a, lse_b (B, H, Lq) -> out (B, H, Lq, Dv), lse (B, H, Lq).
/// \code
/// auto a = sdpa_forward(q, k_first_half, v_first_half), b = sdpa_forward(q, k_second_half, v_second_half);
/// auto all = merge_attention_partials(a.out, a.lse, b.out, b.lse);   // == sdpa_forward(q, k, v)
/// \endcode
template <typename OA, typename LA, typename OB, typename LB>
AttentionPartial<detail::float_scalar_of<OA>> merge_attention_partials(const OA& out_a, const LA& lse_a,
                                                                       const OB& out_b, const LB& lse_b) {
  using T = detail::float_scalar_of<OA>;
  constexpr bool ranks = detail::is_tensor_of_rank<OA, 4> && detail::is_tensor_of_rank<OB, 4> &&
                         detail::is_tensor_of_rank<LA, 3> && detail::is_tensor_of_rank<LB, 3>;
  constexpr bool one_type = detail::all_hold<T, OA, LA, OB, LB>;
  static_assert(ranks,
                "merge_attention_partials: out_a, out_b must be rank-4 (B, H, Lq, Dv) and lse_a, lse_b rank-3 "
                "(B, H, Lq) Tensors or TensorViews");
  static_assert(!ranks || one_type, "merge_attention_partials: all four must hold one element type, float or double");
  if constexpr (ranks && one_type)
    return detail::merge_attention_partials_views<T>(detail::const_view(out_a), detail::const_view(lse_a),
                                                     detail::const_view(out_b), detail::const_view(lse_b));
  else
    return {};
}

}  // namespace selfattn
