/// \file
/// `split_heads` (a zero-copy view), `merge_heads` (the concat) and `average_heads` (the mean over heads of
/// attention weights, PyTorch's `average_attn_weights=True`).
///
/// Shapes: x (B, L, H * D) <-> heads (B, H, L, D). Element (b, l, h * D + d) of x is element (b, h, l, d)
/// of the heads, so the split is just new strides over the same memory.
#pragma once

#include <selfattn/errors.hpp>
#include <selfattn/tensor.hpp>

#include <array>
#include <string>
#include <type_traits>

namespace selfattn {

/// \brief Views x (B, L, H * D) as heads (B, H, L, D) without copying; strides (s0, D, s1, 1).
///
/// Shapes: x (B, L, H * D) -> (B, H, L, D), sharing x's memory (keep x alive while the view is used).
/// Throws ShapeError if `heads` < 1 or does not divide the last extent of x.
/// \code
/// Tensor<float, 3> x({2, 10, 64});
/// TensorView<float, 4> h = split_heads(x, 8);   // (2, 8, 10, 8), h(b, 3, l, d) is x(b, l, 24 + d)
/// \endcode
template <typename T>
TensorView<T, 4> split_heads(const TensorView<T, 3>& x, Index heads) {
  if (heads < 1 || x.dim(2) % heads != 0)
    detail::throw_shape_error("split_heads", "x",
                              "the last extent must be a multiple of heads = " + std::to_string(heads) + ", got shape " +
                                  detail::shape_string<3>(x.shape()));
  const Index head_dim = x.dim(2) / heads;
  return TensorView<T, 4>(x.data(), {x.dim(0), heads, x.dim(1), head_dim}, {x.stride(0), head_dim, x.stride(1), 1});
}
/// \overload
template <typename T>
TensorView<T, 4> split_heads(Tensor<T, 3>& x, Index heads) {
  return split_heads(x.view(), heads);
}
/// \overload
template <typename T>
TensorView<const T, 4> split_heads(const Tensor<T, 3>& x, Index heads) {
  return split_heads(x.view(), heads);
}
/// A view of a temporary tensor would dangle: keep the tensor in a variable.
template <typename T>
TensorView<const T, 4> split_heads(const Tensor<T, 3>&& x, Index heads) = delete;

/// \brief Concatenates heads (B, H, L, D) into a new contiguous (B, L, H * D) tensor: the inverse of split_heads.
///
/// Shapes: heads (B, H, L, D), a Tensor or any strided TensorView -> (B, L, H * D).
/// \code
/// Tensor<float, 3> y = merge_heads(attention_out);   // (B, H, L, D) -> (B, L, H * D)
/// \endcode
template <typename X>
Tensor<detail::float_scalar_of<X>, 3> merge_heads(const X& heads) {
  using T = detail::float_scalar_of<X>;
  static_assert(detail::is_tensor_of_rank<X, 4> && std::is_same_v<detail::scalar_of<X>, T>,
                "merge_heads: heads must be a rank-4 (batch, heads, length, head_dim) Tensor or TensorView of float "
                "or double");
  Tensor<T, 3> merged;
  if constexpr (detail::is_tensor_of_rank<X, 4> && std::is_same_v<detail::scalar_of<X>, T>) {
    const TensorView<const T, 4> x = detail::const_view(heads);
    merged = Tensor<T, 3>({x.dim(0), x.dim(2), x.dim(1) * x.dim(3)});
    if (x.dim(1) == 0) return merged;
    // Copy through the split view of the result, one (L, D) head at a time.
    const TensorView<T, 4> target = split_heads(merged, x.dim(1));
    for (Index b = 0; b < x.dim(0); ++b)
      for (Index h = 0; h < x.dim(1); ++h) as_matrix(target[b][h]) = as_matrix(x[b][h]);
  }
  return merged;
}

/// \brief The mean over heads of per-head attention weights: PyTorch's `average_attn_weights=True`.
///
/// `nn.MultiheadAttention` returns head-averaged weights by default; ours (`fwd.weights` of the module,
/// `attention_weights`, `sdpa_forward` with `need_weights`) are per head, and this turns them into PyTorch's
/// default. Throws ShapeError naming `weights` when it has no head (H = 0).
///
/// Shapes: weights (B, H, Lq, Lk), a Tensor or any strided TensorView of float or double -> (B, Lq, Lk).
/// \code
/// opts.need_weights = true;
/// auto fwd = mha.forward(x, opts);                    // fwd.weights (B, H, L, L)
/// Tensor<float, 3> mean = average_heads(fwd.weights); // (B, L, L), what PyTorch returns by default
/// \endcode
template <typename X>
Tensor<detail::float_scalar_of<X>, 3> average_heads(const X& weights) {
  using T = detail::float_scalar_of<X>;
  static_assert(detail::is_tensor_of_rank<X, 4>,
                "average_heads: weights must be a rank-4 (B, H, Lq, Lk) Tensor or TensorView");
  static_assert(!detail::is_tensor<X> || std::is_same_v<detail::scalar_of<X>, T>,
                "average_heads: weights must hold float or double");
  Tensor<T, 3> mean;
  if constexpr (detail::is_tensor_of_rank<X, 4> && std::is_same_v<detail::scalar_of<X>, T>) {
    const TensorView<const T, 4> w = detail::const_view(weights);
    if (w.dim(1) < 1)
      detail::throw_shape_error("average_heads", "weights",
                                "expected shape (B, H, Lq, Lk) with at least one head, got " +
                                    detail::shape_string<4>(w.shape()));
    mean = Tensor<T, 3>({w.dim(0), w.dim(2), w.dim(3)});
    if (mean.empty()) return mean;
    for (Index b = 0; b < w.dim(0); ++b) {
      auto sum = as_matrix(mean[b]);
      for (Index h = 0; h < w.dim(1); ++h) sum += as_matrix(w[b][h]);  // heads in order 0..H-1
      sum /= static_cast<T>(w.dim(1));
    }
  }
  return mean;
}

namespace detail {

/// Rows [row, row + rows) of batch b of a (B, heads, L) or (B, heads, L, D) view: (1, heads, rows[, D]).
template <typename U, int Rank>
TensorView<U, Rank> rows_of(const TensorView<U, Rank>& x, Index b, Index row, Index rows) {
  std::array<Index, Rank> shape = x.shape();
  shape[0] = 1;
  shape[2] = rows;
  return TensorView<U, Rank>(x.data() + b * x.stride(0) + row * x.stride(2), shape, x.strides());
}

}  // namespace detail

}  // namespace selfattn
