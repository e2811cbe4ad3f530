/// \file
/// The residual sublayer transformer layers are built of, pre- or post-norm, its forward, backward and inference:
///
///     pre-norm  (norm_first):  out = u + dropout(f(norm(u)))
///     post-norm:               out = norm(u + dropout(f(u)))
///
/// with f the self-attention, the cross-attention or the feed-forward network. TransformerLayer runs two sublayers,
/// TransformerDecoderLayer three; f and its backward are theirs.
#pragma once

#include <selfattn/detail/dropout.hpp>
#include <selfattn/nn/norm.hpp>
#include <selfattn/tensor.hpp>

#include <cstdint>
#include <utility>

namespace selfattn::detail {

/// How a layer normalises its sublayers.
template <typename T>
struct SublayerNorm {
  NormKind kind = NormKind::layer_norm;
  T eps = T(1e-5);
  bool first = false;     ///< pre-norm (norm_first); else post-norm
  bool has_bias = false;  ///< the norm has a bias (LayerNorm with cfg.bias)
};

/// What a sublayer's backward needs of its forward (the input u is kept by the caller).
template <typename T>
struct SublayerSaved {
  Tensor<T, 3> normed;    ///< pre-norm: norm(u), f's input
  Tensor<T, 3> residual;  ///< post-norm: u + dropout(f(u)), the norm's input
  NormStatistics<T> stats;
};

/// x + dropout(y), the dropout keyed by `seed`.
template <typename T>
Tensor<T, 3> add_dropped(const TensorView<const T, 3>& x, Tensor<T, 3> y, T p, std::uint64_t seed) {
  dropout_activations<T>(y.view(), p, seed);
  return std::move(y) + x;
}

/// dx of y = norm(x), the norm's parameter gradients into dweight and dbias (sized here; dbias only with a bias).
template <typename T>
Tensor<T, 3> norm_backward(const SublayerNorm<T>& norm, const TensorView<const T, 3>& x, const NormStatistics<T>& stats,
                           const Tensor<T, 1>& weight, const TensorView<const T, 3>& dy, Tensor<T, 1>& dweight,
                           Tensor<T, 1>& dbias) {
  Tensor<T, 3> dx(x.shape());
  dweight = Tensor<T, 1>(weight.shape());
  if (norm.has_bias) dbias = Tensor<T, 1>(weight.shape());
  norm_backward_into<T>(norm.kind, x, stats, weight.view(), dy, dx.view(), dweight.view(), dbias.view());
  return dx;
}

/// The sublayer on u: f(input) returns f's output (B, L, E) for its input view; norm weight and bias (bias empty
/// when absent); dropout rate p keyed by `seed`. What the backward needs goes into `s`.
template <typename T, typename F>
Tensor<T, 3> sublayer_forward(const SublayerNorm<T>& norm, const Tensor<T, 1>& weight, const Tensor<T, 1>& bias,
                              const TensorView<const T, 3>& u, T p, std::uint64_t seed, SublayerSaved<T>& s, F&& f) {
  if (norm.first) {  // u + dropout(f(norm(u)))
    s.normed = norm_inference<T, T>(norm.kind, norm.eps, u, weight, bias, s.stats);
    return add_dropped(u, f(s.normed.view()), p, seed);
  }
  s.residual = add_dropped(u, f(u), p, seed);  // norm(u + dropout(f(u)))
  return norm_inference<T, T>(norm.kind, norm.eps, s.residual.view(), weight, bias, s.stats);
}

/// du of the sublayer for dout = d loss / d out. f_backward(dy) takes dy = d loss / d f(input) and returns
/// d loss / d input (keeping f's parameter gradients itself); the norm's gradients go into dweight and dbias.
template <typename T, typename FB>
Tensor<T, 3> sublayer_backward(const SublayerNorm<T>& norm, const Tensor<T, 1>& weight, const TensorView<const T, 3>& u,
                               T p, std::uint64_t seed, const SublayerSaved<T>& s, const TensorView<const T, 3>& dout,
                               Tensor<T, 1>& dweight, Tensor<T, 1>& dbias, FB&& f_backward) {
  const auto dropped = [&](const TensorView<const T, 3>& dy) {  // dropout's backward: the same mask and scale
    Tensor<T, 3> d(dy);
    dropout_activations<T>(d.view(), p, seed);
    return d;
  };
  if (norm.first) {
    // out = u + dropout(f(n)), n = norm(u):  du = dout + norm'(f'(dropout'(dout)))
    const Tensor<T, 3> dn = f_backward(dropped(dout));
    Tensor<T, 3> du = norm_backward(norm, u, s.stats, weight, dn.view(), dweight, dbias);
    du += dout;
    return du;
  }
  // out = norm(r), r = u + dropout(f(u)):  dr = norm'(dout);  du = dr + f'(dropout'(dr))
  const Tensor<T, 3> dr = norm_backward(norm, s.residual.view(), s.stats, weight, dout, dweight, dbias);
  Tensor<T, 3> du = f_backward(dropped(dr.view()));
  du += dr;
  return du;
}

/// The sublayer at inference (no dropout, nothing saved), the norm's parameters stored as P: T, or 16 bits (widened
/// exactly for the norm).
template <typename T, typename P, typename F>
Tensor<T, 3> sublayer_inference(const SublayerNorm<T>& norm, const Tensor<P, 1>& weight, const Tensor<P, 1>& bias,
                                const TensorView<const T, 3>& u, F&& f) {
  NormStatistics<T> stats;
  if (norm.first) {
    Tensor<T, 3> out = f(norm_inference<T, P>(norm.kind, norm.eps, u, weight, bias, stats).view());
    out += u;  // u + f(norm(u))
    return out;
  }
  Tensor<T, 3> r = f(u);
  r += u;  // norm(u + f(u))
  return norm_inference<T, P>(norm.kind, norm.eps, r.view(), weight, bias, stats);
}

}  // namespace selfattn::detail
