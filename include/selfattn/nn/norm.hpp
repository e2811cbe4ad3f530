/// \file
/// LayerNorm and RMSNorm over the last dimension of a (B, L, E) tensor, forward and backward.
///
/// LayerNorm (Ba et al. 2016, PyTorch's nn.LayerNorm(E)):  y = (x - mean) / sqrt(var + eps) * weight + bias
/// RMSNorm (Zhang & Sennrich 2019, PyTorch's nn.RMSNorm(E)): y = x / sqrt(mean(x^2) + eps) * weight
/// with mean and var (biased, divided by E) over the E features of each row.
///
/// Backward, per row, with xhat the normalised row, r = 1 / sqrt(var + eps) and g = dy * weight:
///   LayerNorm: dx = r (g - mean(g) - xhat mean(g xhat))
///   RMSNorm:   dx = r (g - xhat mean(g xhat))
///   dweight = sum over rows of dy xhat,   dbias = sum over rows of dy
#pragma once

#include <selfattn/detail/rows.hpp>
#include <selfattn/detail/threads.hpp>
#include <selfattn/errors.hpp>
#include <selfattn/half_precision.hpp>
#include <selfattn/nn/module_input.hpp>
#include <selfattn/tensor.hpp>

#include <cmath>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>

namespace selfattn {

/// \brief Which normalisation a transformer layer uses.
enum class NormKind {
  layer_norm,  ///< LayerNorm: subtract the mean, divide by the standard deviation, scale and shift
  rms_norm     ///< RMSNorm: divide by the root mean square, scale (no mean, no bias)
};

/// \brief Parameters of a LayerNorm or RMSNorm (or their gradients): weight (E) and bias (E), empty when absent
/// (bias: always for RMSNorm; both: without affine).
template <typename T>
struct NormParams {
  Tensor<T, 1> weight;  ///< (E): the scale, initialised to 1 (PyTorch's `weight`)
  Tensor<T, 1> bias;    ///< (E): the shift, initialised to 0 (PyTorch's `bias`); empty for RMSNorm
};

namespace detail {

/// Per-row statistics a norm's backward needs: the mean (LayerNorm only) and r = 1 / sqrt(var + eps), (B, L) each.
template <typename T>
struct NormStatistics {
  Tensor<T, 2> mean;  ///< (B, L); empty for RMSNorm
  Tensor<T, 2> rstd;  ///< (B, L)
};

/// y = norm(x) * weight + bias row by row (weight, bias empty when absent), the statistics into `stats`.
template <typename T>
void norm_forward_into(NormKind kind, T eps, const TensorView<const T, 3>& x, const TensorView<const T, 1>& weight,
                       const TensorView<const T, 1>& bias, const TensorView<T, 3>& y, NormStatistics<T>& stats) {
  const Index e = x.dim(2), rows = x.dim(0) * x.dim(1);
  const bool layer = kind == NormKind::layer_norm;
  stats.rstd = Tensor<T, 2>({x.dim(0), x.dim(1)});
  stats.mean = layer ? Tensor<T, 2>({x.dim(0), x.dim(1)}) : Tensor<T, 2>();
  T* mean_out = stats.mean.data();
  T* rstd_out = stats.rstd.data();
  parallel_rows(rows, 6 * e, [&](Index r) {
    const ConstArrayRow<T> in(row_of(x, r), e);
    ArrayRow<T> out(row_of(y, r), e);
    const T mean = layer ? in.mean() : T(0);
    const T var = layer ? (in - mean).square().mean() : in.square().mean();  // two passes: no cancellation
    const T rstd = T(1) / std::sqrt(var + eps);
    out = (in - mean) * rstd;
    if (!weight.empty()) out *= ConstArrayRow<T>(weight.data(), e);
    if (!bias.empty()) out += ConstArrayRow<T>(bias.data(), e);
    if (layer) mean_out[r] = mean;
    rstd_out[r] = rstd;
  });
}

/// norm_forward_into into a new (B, L, E) tensor with weight and bias stored as P: T, or 16 bits (an inference with
/// 16-bit parameters), then widened exactly first (E values each): the norm of T weights holding the same values.
template <typename T, typename P>
Tensor<T, 3> norm_inference(NormKind kind, T eps, const TensorView<const T, 3>& x, const Tensor<P, 1>& weight,
                            const Tensor<P, 1>& bias, NormStatistics<T>& stats) {
  if constexpr (!std::is_same_v<P, T>) {
    return norm_inference<T, T>(kind, eps, x, tensor_cast<T>(weight), tensor_cast<T>(bias), stats);
  } else {
    Tensor<T, 3> y(x.shape());
    norm_forward_into<T>(kind, eps, x, weight.view(), bias.view(), y.view(), stats);
    return y;
  }
}

/// dx from dy (see the file comment); dweight and dbias (when not empty) are overwritten with their sums over the
/// rows. The sums run in per-thread partials added in thread order: the same thread count gives the same bits.
template <typename T>
void norm_backward_into(NormKind kind, const TensorView<const T, 3>& x, const NormStatistics<T>& stats,
                        const TensorView<const T, 1>& weight, const TensorView<const T, 3>& dy,
                        const TensorView<T, 3>& dx, const TensorView<T, 1>& dweight, const TensorView<T, 1>& dbias) {
  const Index e = x.dim(2), rows = x.dim(0) * x.dim(1);
  const bool layer = kind == NormKind::layer_norm;
  const int threads = threads_for(static_cast<double>(rows) * static_cast<double>(8 * e), rows);
  using Partials = Eigen::Array<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  Partials weight_sums = Partials::Zero(dweight.empty() ? 0 : threads, e);
  Partials bias_sums = Partials::Zero(dbias.empty() ? 0 : threads, e);
#ifdef _OPENMP
#pragma omp parallel num_threads(threads) if (threads > 1)
#endif
  {
    const int t = thread_id();
    Eigen::Array<T, 1, Eigen::Dynamic> xhat(e), g(e);
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
    for (Index r = 0; r < rows; ++r) {
      const ConstArrayRow<T> in(row_of(x, r), e);
      const ConstArrayRow<T> grad(row_of(dy, r), e);
      ArrayRow<T> out(row_of(dx, r), e);
      const T rstd = stats.rstd.data()[r];
      xhat = (in - (layer ? stats.mean.data()[r] : T(0))) * rstd;
      if (weight.empty())
        g = grad;
      else
        g = grad * ConstArrayRow<T>(weight.data(), e);
      const T mean_g_xhat = (g * xhat).mean();
      if (layer)
        out = rstd * (g - g.mean() - xhat * mean_g_xhat);  // dx = r (g - mean(g) - xhat mean(g xhat))
      else
        out = rstd * (g - xhat * mean_g_xhat);  // dx = r (g - xhat mean(g xhat))
      if (!dweight.empty()) weight_sums.row(t) += grad * xhat;  // dweight = sum dy xhat
      if (!dbias.empty()) bias_sums.row(t) += grad;             // dbias = sum dy
    }
  }
  if (!dweight.empty()) ArrayRow<T>(dweight.data(), e) = weight_sums.colwise().sum();
  if (!dbias.empty()) ArrayRow<T>(dbias.data(), e) = bias_sums.colwise().sum();
}

/// Throws unless eps is finite and >= 0.
inline void check_norm_eps(const char* function, const char* name, double eps) {
  if (!(eps >= 0.0 && std::isfinite(eps)))
    throw_invalid(function, name, "expected a finite value >= 0, got " + std::to_string(eps));
}

/// Throws ShapeError unless a norm parameter is (dim), or empty when absent.
template <typename T>
void check_norm_param(const char* function, const std::string& name, const Tensor<T, 1>& p, bool present, Index dim) {
  check_shape<1>(function, name, p.shape(), {present ? dim : 0});
}

}  // namespace detail

/// \brief What a norm's forward returns: the output and what its backward needs.
///
/// Shapes: output (B, L, E); input the forward's x (B, L, E).
template <typename T>
struct NormForward {
  Tensor<T, 3> output;              ///< (B, L, E)
  TensorView<const T, 3> input;     ///< (B, L, E): view of x, kept for backward (owned by `kept` if x was a temporary)
  detail::NormStatistics<T> stats;  ///< Internal: per-row mean and 1 / sqrt(var + eps)
  std::shared_ptr<const Tensor<T, 3>> kept;  ///< Internal: x when it was passed as a temporary Tensor
};

/// \brief What a norm's backward returns: d_input (B, L, E) and the parameter gradients (weight, bias: (E), empty
/// when the norm has no such parameter).
template <typename T>
struct NormGradients {
  Tensor<T, 3> d_input;  ///< (B, L, E)
  NormParams<T> params;  ///< gradients of weight and bias
};

namespace detail {

/// What LayerNorm and RMSNorm share: the configuration, the parameters, forward and backward.
template <typename T>
class Normalization {
  static_assert(std::is_floating_point_v<T>, "LayerNorm<T> / RMSNorm<T>: T is float or double");

 public:
  Index dim() const { return dim_; }       ///< E, the normalised (last) dimension
  double eps() const { return eps_; }      ///< added to the variance (mean square) before the square root
  NormKind kind() const { return kind_; }  ///< layer_norm or rms_norm
  /// The parameters, writable (keep their shapes): weight (E) initialised to 1, bias (E) to 0; empty when absent.
  NormParams<T>& params() { return params_; }
  /// \overload
  const NormParams<T>& params() const { return params_; }

  /// \brief Normalises each row of x (B, L, E). A temporary Tensor argument is moved into the result (kept for
  /// backward); a named tensor or view stays the caller's to keep alive until backward.
  template <typename X>
  NormForward<T> forward(X&& x) const {
    NormForward<T> f;
    if constexpr (check_module_arguments<T, X>()) {
      SavedInput<T> saved = save_input<T>(std::forward<X>(x));
      check_shape<3>(forward_name_, "x", saved.view.shape(), {any_extent, any_extent, dim_});
      check_params(forward_name_);
      f.output = Tensor<T, 3>(saved.view.shape());
      norm_forward_into<T>(kind_, static_cast<T>(eps_), saved.view, params_.weight.view(), params_.bias.view(),
                           f.output.view(), f.stats);
      f.input = saved.view;
      f.kept = std::move(saved.owned);
    }
    return f;
  }

  /// \brief Gradients given dout = d loss / d output (B, L, E) of the forward `f`; the parameters must be unchanged
  /// since that forward. ShapeError naming `dout` for a wrong shape.
  template <typename DO>
  NormGradients<T> backward(const DO& dout, const NormForward<T>& f) const {
    NormGradients<T> g;
    if constexpr (check_module_arguments<T, DO>()) {
      const TensorView<const T, 3> dy = const_view(dout);
      if (f.stats.rstd.empty() && !f.input.empty())
        throw_invalid(backward_name_, "fwd", "is not the result of a forward call");
      check_shape<3>(backward_name_, "dout", dy.shape(), f.output.shape());
      check_params(backward_name_);
      g.d_input = Tensor<T, 3>(dy.shape());
      if (!params_.weight.empty()) g.params.weight = Tensor<T, 1>(params_.weight.shape());
      if (!params_.bias.empty()) g.params.bias = Tensor<T, 1>(params_.bias.shape());
      norm_backward_into<T>(kind_, f.input, f.stats, params_.weight.view(), dy, g.d_input.view(), g.params.weight.view(),
                            g.params.bias.view());
    }
    return g;
  }

 protected:
  Normalization(NormKind kind, Index dim, double eps, bool weight, bool bias, const char* forward_name,
                const char* backward_name)
      : kind_(kind), dim_(dim), eps_(eps), has_weight_(weight), has_bias_(bias), forward_name_(forward_name),
        backward_name_(backward_name) {
    if (dim < 1) throw_invalid(forward_name_, "dim", "expected >= 1, got " + std::to_string(dim));
    check_norm_eps(forward_name_, "eps", eps);
    if (weight) {
      params_.weight = Tensor<T, 1>(std::array<Index, 1>{dim});
      params_.weight.fill(T(1));
    }
    if (bias) params_.bias = Tensor<T, 1>(std::array<Index, 1>{dim});
  }

 private:
  void check_params(const char* function) const {
    check_norm_param(function, "params().weight", params_.weight, has_weight_, dim_);
    check_norm_param(function, "params().bias", params_.bias, has_bias_, dim_);
  }

  NormKind kind_;
  Index dim_;
  double eps_;
  bool has_weight_, has_bias_;
  const char* forward_name_;
  const char* backward_name_;
  NormParams<T> params_;
};

}  // namespace detail

/// \brief Layer normalisation over the last dimension, PyTorch's nn.LayerNorm(dim, eps, elementwise_affine).
///
/// Shapes: forward(x (B, L, E)) -> output (B, L, E); params weight (E), bias (E) (empty without affine).
/// \code
/// LayerNorm<float> norm(512);                       // eps 1e-5, weight 1, bias 0
/// NormForward<float> f = norm.forward(x);           // x (B, L, 512)
/// NormGradients<float> g = norm.backward(dout, f);  // g.d_input, g.params.weight, g.params.bias
/// \endcode
template <typename T>
class LayerNorm : public detail::Normalization<T> {
 public:
  /// dim = E >= 1; eps finite and >= 0; affine: learn weight and bias. std::invalid_argument naming the argument.
  explicit LayerNorm(Index dim, double eps = 1e-5, bool affine = true)
      : detail::Normalization<T>(NormKind::layer_norm, dim, eps, affine, affine, "LayerNorm::forward",
                                 "LayerNorm::backward") {}
};

/// \brief Root-mean-square normalisation over the last dimension (no mean subtraction, no bias), PyTorch's
/// nn.RMSNorm(dim, eps, elementwise_affine) and the norm of Llama.
///
/// Shapes: forward(x (B, L, E)) -> output (B, L, E); params weight (E) (empty without affine), bias always empty.
/// \code
/// RMSNorm<float> norm(512, 1e-6);
/// Tensor<float, 3> y = norm.forward(x).output;
/// \endcode
template <typename T>
class RMSNorm : public detail::Normalization<T> {
 public:
  /// dim = E >= 1; eps finite and >= 0; affine: learn the weight. std::invalid_argument naming the argument.
  explicit RMSNorm(Index dim, double eps = 1e-5, bool affine = true)
      : detail::Normalization<T>(NormKind::rms_norm, dim, eps, affine, false, "RMSNorm::forward", "RMSNorm::backward") {}
};

}  // namespace selfattn
