/// \file
/// MaskView: the type of `AttentionOptions::allowed` and `AttentionOptions::bias`, a `TensorView<const U, 4>` that
/// also takes a mask or bias of rank 2 or 3, read as `torch.nn.functional.scaled_dot_product_attention` reads its
/// `attn_mask`; and allowed_from_key_padding, nn.MultiheadAttention's `key_padding_mask` in `allowed`'s polarity.
/// Polarities and the broadcast rule: docs/masks.md.
#pragma once

#include <selfattn/tensor.hpp>

#include <array>
#include <type_traits>

namespace selfattn {

/// \brief A mask or bias for attention scores (B, H, Lq, Lk): a `TensorView<const U, 4>`, built from a Tensor or
/// TensorView of U of rank 2, 3 or 4.
///
/// The rank-4 view broadcasts against (B, H, Lq, Lk) (each extent 1 or equal). A lower rank lines up with the
/// scores from the right, NumPy's rule and PyTorch's `scaled_dot_product_attention`'s: (Lq, Lk) is read as
/// (1, 1, Lq, Lk) and (d0, Lq, Lk) as (1, d0, Lq, Lk), so a 3-D mask's first dimension is the HEADS (H or 1), not
/// the batch. The added dimensions have extent 1 and stride 0: no copy, the caller's memory is read in place and
/// must outlive the call. A temporary Tensor does not convert (the view would dangle); a rank other than 2, 3 or 4,
/// or another element type, does not compile.
///
/// Shapes: (Lq, Lk), (H|1, Lq, Lk) or (B|1, H|1, Lq|1, Lk|1).
/// \code
/// Tensor<bool, 2> causal_mask({L, L});     // PyTorch's torch.ones(L, L).tril() as an SDPA attn_mask
/// opts.allowed = causal_mask;              // read as (1, 1, L, L)
/// Tensor<float, 3> head_bias({H, L, L});   // one relative-position bias per head
/// opts.bias = head_bias;                   // read as (1, H, L, L)
/// \endcode
template <typename U>
class MaskView : public TensorView<const U, 4> {
  using Base = TensorView<const U, 4>;

  /// An rvalue Tensor of U: it goes to the deleted constructor below, not to the converting one.
  template <typename X>
  static constexpr bool is_temporary_tensor =
      !std::is_lvalue_reference_v<X> &&
      std::is_same_v<std::decay_t<X>, Tensor<U, detail::tensor_traits<std::decay_t<X>>::rank>>;

 public:
  MaskView() = default;  ///< absent: null data, every extent 0

  /// A Tensor or TensorView of U of rank 2, 3 or 4 (a rank-4 view as it is; lower ranks get leading extents of 1).
  template <typename X, typename = std::enable_if_t<detail::is_tensor<X> && !is_temporary_tensor<X>>>
  MaskView(X&& mask)  // NOLINT(google-explicit-constructor): implicit, like Tensor -> TensorView
      : Base(rank4(detail::const_view(mask))) {}

  /// A view of a temporary tensor would dangle when the statement ends (`opts.bias = make_bias();`): keep the
  /// tensor in a variable and view that.
  template <typename V, int Rank>
  MaskView(const Tensor<V, Rank>&& tensor) = delete;

 private:
  template <typename V, int Rank>
  static Base rank4(const TensorView<const V, Rank>& mask) {
    static_assert(std::is_same_v<V, U>,
                  "selfattn: opts.allowed holds bool and opts.bias the element type T of AttentionOptions<T>");
    static_assert(!std::is_same_v<V, U> || (Rank >= 2 && Rank <= 4),
                  "selfattn: an attention mask or bias has rank 2 (Lq, Lk), 3 (H, Lq, Lk) or 4 (B, H, Lq, Lk)");
    if constexpr (std::is_same_v<V, U> && Rank == 4) {
      return mask;
    } else if constexpr (std::is_same_v<V, U> && Rank >= 2 && Rank < 4) {
      // Right-aligned, as NumPy broadcasts: dimension d of the mask is dimension 4 - Rank + d of the scores.
      std::array<Index, 4> shape{1, 1, 1, 1}, strides{0, 0, 0, 0};
      for (int d = 0; d < Rank; ++d) {
        shape[static_cast<std::size_t>(4 - Rank + d)] = mask.dim(d);
        strides[static_cast<std::size_t>(4 - Rank + d)] = mask.stride(d);
      }
      return Base(mask.data(), shape, strides);
    } else {
      return Base();  // unreachable: a static_assert above has failed
    }
  }
};

/// \brief nn.MultiheadAttention's `key_padding_mask` (B, Lk), `true` = padding (ignore this key), as the `allowed`
/// mask it means: (B, 1, 1, Lk), `true` = may attend. The values are negated, so this is a new tensor (not a view):
/// keep it alive while `opts.allowed` views it.
///
/// Padding that is a suffix is said without a tensor by `opts.key_lengths` (the number of `false` entries per row).
/// To combine key padding with another boolean mask, `and` the two into one tensor (`allowed` is a single mask).
///
/// Shapes: key_padding_mask (B, Lk), a Tensor or TensorView of bool -> (B, 1, 1, Lk).
/// \code
/// Tensor<bool, 2> pad({2, 6});                                  // pad[1, 0] = true: left padding in sequence 1
/// const Tensor<bool, 4> keep = allowed_from_key_padding(pad);   // (2, 1, 1, 6), keep(1, 0, 0, 0) == false
/// opts.allowed = keep;
/// \endcode
template <typename M>
Tensor<bool, 4> allowed_from_key_padding(const M& key_padding_mask) {
  constexpr bool valid = detail::is_tensor_of_rank<M, 2> && std::is_same_v<detail::scalar_of<M>, bool>;
  static_assert(valid,
                "selfattn::allowed_from_key_padding: key_padding_mask is a (B, Lk) Tensor or TensorView of bool");
  if constexpr (valid) {
    const TensorView<const bool, 2> padding = detail::const_view(key_padding_mask);
    Tensor<bool, 4> allowed(std::array<Index, 4>{padding.dim(0), 1, 1, padding.dim(1)});
    for (Index b = 0; b < padding.dim(0); ++b)
      for (Index j = 0; j < padding.dim(1); ++j) allowed(b, 0, 0, j) = !padding(b, j);  // true = padding: masked
    return allowed;
  } else {
    return {};
  }
}

}  // namespace selfattn
