/// \file
/// The affine projection y = x W^T + b (PyTorch's nn.Linear layout) and the
/// fused Q/K/V projection that reads x once when query = key = value.
///
/// Shapes: x (B, L, In), W (Out, In), b (Out) or absent -> y (B, L, Out).
#pragma once

#include <selfattn/detail/dispatch.hpp>
#include <selfattn/errors.hpp>
#include <selfattn/half_precision.hpp>
#include <selfattn/tensor.hpp>

#include <array>
#include <string>
#include <type_traits>

namespace selfattn {
namespace detail {

/// y = x W^T + b into a preallocated y (B, L, Out), which may be a column block of a wider buffer.
/// Arguments are valid (checked by the caller).
template <typename T>
void linear_into(const TensorView<const T, 3>& x, const TensorView<const T, 2>& weight,
                 const TensorView<const T, 1>& bias, const TensorView<T, 3>& y) {
  const auto w = as_matrix(weight);
  // When the (B, L) rows are evenly spaced in both x and y, all B * L rows go through one GEMM.
  const bool one_gemm = x.stride(0) == x.dim(1) * x.stride(1) && y.stride(0) == y.dim(1) * y.stride(1);
  const Index blocks = one_gemm ? 1 : x.dim(0);
  const Index rows = one_gemm ? x.dim(0) * x.dim(1) : x.dim(1);
  for (Index b = 0; b < blocks; ++b) {
    const TensorView<const T, 2> xb(x.data() + b * x.stride(0), {rows, x.dim(2)}, {x.stride(1), 1});
    const TensorView<T, 2> yb(y.data() + b * y.stride(0), {rows, y.dim(2)}, {y.stride(1), 1});
    if (weight.stride(1) == 1 && linear_at_level<T>(rows, weight.dim(0), x.dim(2), xb.data(), xb.stride(0),
                                                    weight.data(), weight.stride(0), bias.empty() ? nullptr : bias.data(),
                                                    yb.data(), yb.stride(0)))
      continue;  // the dispatched level's GEMM (detail/dispatch.hpp); Eigen's below
    auto out = as_matrix(yb);
    out.noalias() = as_matrix(xb) * w.transpose();  // y = x W^T
    if (!bias.empty()) out.rowwise() += as_vector(bias);  // + b (an empty bias is absent)
  }
}

/// Checks W (Out, In) against x (B, L, In) and b (Out) or absent.
template <typename T>
void check_linear_arguments(const char* function, const std::string& name, const TensorView<const T, 3>& x,
                            const TensorView<const T, 2>& weight, const TensorView<const T, 1>& bias) {
  const std::string prefix = name.empty() ? std::string() : name + " ";
  check_shape<2>(function, prefix + "weight", weight.shape(), {any_extent, x.dim(2)});
  if (!bias.empty()) check_shape<1>(function, prefix + "bias", bias.shape(), {weight.dim(0)});  // empty: absent
}

}  // namespace detail

/// \brief y = x W^T + b, PyTorch's nn.Linear: x (B, L, In), weight (Out, In), bias (Out) or empty -> (B, L, Out).
///
/// Shapes: x (B, L, In), weight (Out, In), bias (Out) or empty (absent) -> y (B, L, Out).
/// Throws ShapeError naming `weight` or `bias` when they do not fit x.
/// \code
/// Tensor<float, 3> x({2, 10, 64});
/// Tensor<float, 2> W({32, 64});
/// Tensor<float, 1> b({32});
/// Tensor<float, 3> y = linear<float>(x, W, b);   // (2, 10, 32)
/// \endcode
template <typename T>
Tensor<T, 3> linear(const TensorView<const T, 3>& x, const TensorView<const T, 2>& weight,
                    const TensorView<const T, 1>& bias = {}) {
  detail::check_linear_arguments("linear", "", x, weight, bias);
  Tensor<T, 3> y({x.dim(0), x.dim(1), weight.dim(0)});
  detail::linear_into(x, weight, bias, y.view());
  return y;
}

/// \brief Gradients of y = x W^T + b: dx like x, dweight like W, dbias (Out) or empty without a bias.
template <typename T>
struct LinearGradients {
  Tensor<T, 3> dx;       ///< (B, L, In): dy W
  Tensor<T, 2> dweight;  ///< (Out, In): dy^T x, summed over B and L
  Tensor<T, 1> dbias;    ///< (Out): dy summed over B and L; empty unless `with_bias`
};

/// \brief The backward of `linear`: given x (B, L, In), weight (Out, In) and dy (B, L, Out),
///   dx = dy W,   dW = dy^T x (summed over B and L),   db = sum over B and L of dy   (db only when `with_bias`).
///
/// Shapes: x (B, L, In), weight (Out, In), dy (B, L, Out) -> dx (B, L, In), dweight (Out, In), dbias (Out).
/// Throws ShapeError naming `weight` or `dy` when they do not fit x.
/// \code
/// auto g = linear_backward<float>(x, W, dy, true);   // g.dx, g.dweight, g.dbias
/// \endcode
template <typename T>
LinearGradients<T> linear_backward(const TensorView<const T, 3>& x, const TensorView<const T, 2>& weight,
                                   const TensorView<const T, 3>& dy, bool with_bias) {
  detail::check_shape<2>("linear_backward", "weight", weight.shape(), {detail::any_extent, x.dim(2)});
  detail::check_shape<3>("linear_backward", "dy", dy.shape(), {x.dim(0), x.dim(1), weight.dim(0)});
  LinearGradients<T> g{Tensor<T, 3>(x.shape()), Tensor<T, 2>(weight.shape()), Tensor<T, 1>()};
  if (with_bias) g.dbias = Tensor<T, 1>(std::array<Index, 1>{weight.dim(0)});
  const auto w = as_matrix(weight);
  auto dweight = as_matrix(g.dweight);
  const Index length = x.dim(1), in = x.dim(2), out = weight.dim(0);
  for (Index b = 0; b < x.dim(0); ++b) {
    const auto x_b = as_matrix(x[b]);
    const auto dy_b = as_matrix(dy[b]);
    const T* x_data = x.data() + b * x.stride(0);
    const T* dy_data = dy.data() + b * dy.stride(0);
    // dX = dY W: the dispatched GEMM reads W as (W^T)^T in place (detail/dispatch.hpp), else Eigen's.
    if (!detail::gemm_at_level<T>(length, in, out, {dy_data, dy.stride(1), dy.stride(2)},
                                  {weight.data(), weight.stride(1), weight.stride(0)}, nullptr, g.dx[b].data(), in,
                                  false))
      as_matrix(g.dx[b]).noalias() = dy_b * w;
    if (x_b.allFinite()) {
      // dW += dY^T X: dY^T and X^T read in place; g.dweight starts at zero, so the first batch entry may add.
      if (!detail::gemm_at_level<T>(out, in, length, {dy_data, dy.stride(2), dy.stride(1)},
                                    {x_data, x.stride(2), x.stride(1)}, nullptr, g.dweight.data(), in, true))
        dweight.noalias() += dy_b.transpose() * x_b;
    } else {
      // A row of x holding inf or NaN whose dY row is 0 (a masked-out key, say) contributes nothing, but the
      // GEMM would add 0 * NaN = NaN: such rows are left out of the sum (docs/numerics.md).
      for (Index l = 0; l < x_b.rows(); ++l)
        if (!dy_b.row(l).isZero(T(0))) dweight.noalias() += dy_b.row(l).transpose() * x_b.row(l);
    }
    if (with_bias) as_vector(g.dbias.view()) += dy_b.colwise().sum();  // db = sum dY
  }
  return g;
}

namespace detail {

/// The three projections of self-attention in one GEMM: y = x [Wq; Wk; Wv]^T + [bq; bk; bv], shape
/// (B, L, Out_q + Out_k + Out_v); q, k and v are its column blocks in that order. Reading x once and
/// running one wide GEMM beats three narrow ones. Biases are all present or all absent.
///
/// Stacking copies the weights, O(Out * In); the GEMM is O(B L Out In). For a few rows (a decode step) the
/// copy would cost more than the product, so there each projection writes its column block directly.
constexpr Index fused_projection_min_rows = 16;

/// The stacked weight and bias of fused_qkv_projection_into, kept by a caller that projects in a loop: the same
/// sizes from call to call reallocate nothing.
template <typename T>
struct StackedProjection {
  RowMajorMatrix<T> weight;
  Eigen::Matrix<T, Eigen::Dynamic, 1> bias;
};

/// linear_into with W (Out, In) and b (Out) or empty stored as W: T, or 16 bits with x and y in T = float. A few rows
/// (fewer than fused_projection_min_rows: a decode step) read W in place (linear_few_rows at the selected level:
/// bound by memory, threads sharing the outputs; with 16-bit weights half the bytes, and bitwise the result of float
/// weights of the same values); more rows run the GEMM (linear_into), 16-bit W and b first widened once into
/// `scratch`.
template <typename T, typename W>
void linear_into_stored(const TensorView<const T, 3>& x, const TensorView<const W, 2>& weight,
                        const TensorView<const W, 1>& bias, const TensorView<T, 3>& y, StackedProjection<T>& scratch) {
  static_assert(std::is_same_v<W, T> || (std::is_same_v<T, float> && is_half_width_v<W>),
                "16-bit weights project float activations");
  const Index rows = x.dim(0) * x.dim(1);
  if (rows == 0) return;
  if (rows < fused_projection_min_rows) {
    std::array<const T*, few_rows_max> x_rows{};
    std::array<T*, few_rows_max> y_rows{};
    for (Index r = 0; r < rows; ++r) {
      const Index b = r / x.dim(1), l = r % x.dim(1);
      x_rows[static_cast<std::size_t>(r)] = x.data() + b * x.stride(0) + l * x.stride(1);
      y_rows[static_cast<std::size_t>(r)] = y.data() + b * y.stride(0) + l * y.stride(1);
    }
    linear_few_rows_at_level<T, W>(x_rows, y_rows, rows, x.dim(2), weight, bias);
    return;
  }
  if constexpr (std::is_same_v<W, T>) {
    linear_into(x, weight, bias, y);
  } else {
    scratch.weight.resize(weight.dim(0), weight.dim(1));
    convert_view<W, T, 2>(weight, TensorView<T, 2>(scratch.weight.data(), weight.shape()));
    scratch.bias.resize(bias.size());
    if (!bias.empty()) convert_view<W, T, 1>(bias, TensorView<T, 1>(scratch.bias.data(), bias.shape()));
    linear_into<T>(x, TensorView<const T, 2>(scratch.weight.data(), weight.shape()),
                   bias.empty() ? TensorView<const T, 1>() : TensorView<const T, 1>(scratch.bias.data(), bias.shape()), y);
  }
}

/// fused_qkv_projection into y (B, L, Out_q + Out_k + Out_v), contiguous in its last two dimensions as the
/// allocating form's result is; the stacked weights live in `stacked`. Weights and biases stored as W: T, or 16 bits
/// (widened as they are stacked; read in place by linear_into_stored for a few rows).
template <typename T, typename W = T>
void fused_qkv_projection_into(const TensorView<const T, 3>& x, const std::array<TensorView<const W, 2>, 3>& weights,
                               const std::array<TensorView<const W, 1>, 3>& biases, const TensorView<T, 3>& y,
                               StackedProjection<T>& stacked) {
  if (y.empty()) return;  // no rows (B = 0 or L = 0): nothing to write, and y.data() may be null
  const Index outputs = weights[0].dim(0) + weights[1].dim(0) + weights[2].dim(0);
  if (x.dim(0) * x.dim(1) < fused_projection_min_rows) {
    Index column = 0;
    for (std::size_t m = 0; m < 3; ++m) {
      const TensorView<T, 3> block(y.data() + column, {x.dim(0), x.dim(1), weights[m].dim(0)}, y.strides());
      linear_into_stored<T, W>(x, weights[m], biases[m], block, stacked);
      column += weights[m].dim(0);
    }
    return;
  }
  stacked.weight.resize(outputs, x.dim(2));
  // An empty bias is absent (a module without biases holds empty ones).
  const bool has_bias = !biases[0].empty() || !biases[1].empty() || !biases[2].empty();
  stacked.bias.setZero(has_bias ? outputs : 0);
  Index row = 0;
  for (std::size_t m = 0; m < 3; ++m) {
    stacked.weight.middleRows(row, weights[m].dim(0)) = as_matrix(weights[m]).template cast<T>();
    if (!biases[m].empty()) stacked.bias.segment(row, weights[m].dim(0)) = as_vector(biases[m]).template cast<T>();
    row += weights[m].dim(0);
  }
  const TensorView<const T, 2> w(stacked.weight.data(), {outputs, x.dim(2)});
  const TensorView<const T, 1> b(stacked.bias.data(), std::array<Index, 1>{outputs});
  linear_into(x, w, has_bias ? b : TensorView<const T, 1>(), y);
}

template <typename T>
Tensor<T, 3> fused_qkv_projection(const TensorView<const T, 3>& x, const std::array<TensorView<const T, 2>, 3>& weights,
                                  const std::array<TensorView<const T, 1>, 3>& biases) {
  const Index outputs = weights[0].dim(0) + weights[1].dim(0) + weights[2].dim(0);
  Tensor<T, 3> y({x.dim(0), x.dim(1), outputs});
  StackedProjection<T> stacked;
  fused_qkv_projection_into(x, weights, biases, y.view(), stacked);
  return y;
}

}  // namespace detail
}  // namespace selfattn
