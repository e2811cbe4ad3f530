/// \file
/// `attend_with_weights`: the second half of attention, out = P V, with the probabilities P given by the caller.
///
/// Dimension letters: B batch, H query heads, Hkv key/value heads (H % Hkv == 0), Lq query length, Lk key length,
/// Dv value head dim. Query head h reads value head h / (H / Hkv), as in sdpa_forward.
///
/// What it is for: running a model with attention weights of your choice, e.g. to ask "would the prediction change
/// if this head looked elsewhere?" (docs/explanation.md). A MultiHeadAttention module is linear after its softmax,
/// so its output with weights P is
/// \code{.unparsed}
///   values = split_heads(linear(value, v_weight, v_bias), Hkv)                           (B, Hkv, Lk, Dh)
///   output = linear(merge_heads(attend_with_weights(P, values)), out_weight, out_bias)   (B, Lq, E)
/// \endcode
/// which examples/coreference.cpp composes from the public pieces (and tests/attend_with_weights_test.cpp checks
/// against MultiHeadAttention::forward).
#pragma once

#include <selfattn/errors.hpp>
#include <selfattn/tensor.hpp>

#include <string>
#include <type_traits>

namespace selfattn {

namespace detail {

/// attend_with_weights on views of one element type: validate, allocate, one GEMM per (batch, query head).
template <typename T>
Tensor<T, 4> attend_with_weights_views(const TensorView<const T, 4>& weights, const TensorView<const T, 4>& v) {
  constexpr const char* function = "attend_with_weights";
  check_shape<4>(function, "v", v.shape(), {weights.dim(0), any_extent, weights.dim(3), any_extent});
  if (v.dim(1) < 1 || weights.dim(1) % v.dim(1) != 0)
    throw_shape_error(function, "v",
                      "the number of value heads (dim 1) must divide the " + std::to_string(weights.dim(1)) +
                          " heads of weights, got shape " + shape_string<4>(v.shape()));
  Tensor<T, 4> out({weights.dim(0), weights.dim(1), weights.dim(2), v.dim(3)});  // zero: right for Lk = 0
  if (out.empty() || weights.dim(3) == 0) return out;
  const Index group = weights.dim(1) / v.dim(1);  // query heads per value head
  for (Index b = 0; b < weights.dim(0); ++b)
    for (Index h = 0; h < weights.dim(1); ++h)
      as_matrix(out[b][h]).noalias() = as_matrix(weights[b][h]) * as_matrix(v[b][h / group]);  // (Lq, Dv) = P V
  return out;
}

}  // namespace detail

/// \brief out = weights v per head: attention with the probabilities supplied instead of computed from q and k.
///
/// Shapes: weights (B, H, Lq, Lk), v (B, Hkv, Lk, Dv) with Hkv dividing H -> (B, H, Lq, Dv); query head h reads
/// value head h / (H / Hkv) (grouped-query heads, as sdpa_forward). Arguments may be any mix of `Tensor` and
/// `TensorView` (any row strides, contiguous last dimension) of one element type, float or double.
///
/// The weights are used as given: rows need not sum to 1 and nothing is masked, so give masked keys weight 0
/// (`attention_weights` and the `weights` of sdpa_forward / MultiHeadAttention::forward already do). Unlike
/// sdpa_forward, which skips masked keys, a zero weight still multiplies its value row: keep NaN and infinity out
/// of v. With the weights sdpa_forward computes (and no dropout), the result is sdpa_forward's `out` up to rounding.
/// Throws ShapeError naming `v` when its batch or length differs from the weights' or Hkv does not divide H.
/// \code
/// AttentionOptions<double> opts;
/// opts.causal = Causal::top_left;
/// Tensor<double, 4> p = attention_weights(q, k, opts);  // (B, H, Lq, Lk)
/// for (Index j = 0; j < p.dim(3); ++j) p(0, 2, 5, j) = j <= 5 ? 1.0 / 6 : 0.0;  // head 2, row 5: uniform
/// Tensor<double, 4> out = attend_with_weights(p, v);  // (B, H, Lq, Dv): sdpa_forward's out but for that row
/// \endcode
template <typename W, typename V>
Tensor<detail::float_scalar_of<W>, 4> attend_with_weights(const W& weights, const V& v) {
  using T = detail::float_scalar_of<W>;
  constexpr bool rank_4 = detail::is_tensor_of_rank<W, 4> && detail::is_tensor_of_rank<V, 4>;
  constexpr bool one_type =
      rank_4 && std::is_same_v<detail::scalar_of<W>, T> && std::is_same_v<detail::scalar_of<V>, T>;
  static_assert(
      rank_4,
      "attend_with_weights: weights (B, H, Lq, Lk) and v (B, Hkv, Lk, Dv) must be rank-4 Tensors or TensorViews");
  static_assert(!rank_4 || one_type, "attend_with_weights: weights and v must hold one element type, float or double");
  if constexpr (one_type)
    return detail::attend_with_weights_views(detail::const_view(weights), detail::const_view(v));
  else
    return {};
}

}  // namespace selfattn
