/// \file
/// The vocabulary of MultiHeadAttention: its configuration, its parameters (with PyTorch's initialisation and the
/// conversion to 16 bits), and what its forward and backward return.
///
/// Dimension letters: B batch, Lq query length, Lk key length, E embed dim, H query heads, Hkv key/value
/// heads, Dh = E / H head dim. Parameters use PyTorch's nn.Linear layout (y = x W^T + b), so the weights
/// of an nn.MultiheadAttention load as they are.
#pragma once

#include <selfattn/attention.hpp>
#include <selfattn/half_precision.hpp>
#include <selfattn/options.hpp>
#include <selfattn/positional.hpp>
#include <selfattn/tensor.hpp>

#include <array>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>

namespace selfattn {

/// \brief Configuration of a MultiHeadAttention module. Zero means "the default" where noted.
///
/// Shapes it sets: query (B, Lq, embed_dim), key (B, Lk, kdim), value (B, Lk, vdim); H = num_heads query heads
/// and Hkv = num_kv_heads key/value heads of Dh = embed_dim / num_heads. The module's constructor throws
/// std::invalid_argument naming the field when the configuration is invalid.
/// \code
/// MultiHeadAttentionConfig cfg;
/// cfg.embed_dim = 512;    // E
/// cfg.num_heads = 8;      // H, Dh = 64
/// cfg.num_kv_heads = 2;   // grouped-query attention: 4 query heads per key/value head
/// cfg.rope_dim = 64;      // rotary embedding on the whole head
/// \endcode
struct MultiHeadAttentionConfig {
  Index embed_dim = 0;       ///< E; must be a multiple of num_heads
  Index num_heads = 1;       ///< H; head dim Dh = E / H
  Index num_kv_heads = 0;    ///< Hkv; 0 = num_heads; fewer = grouped-query attention (must divide H)
  Index kdim = 0;            ///< key input width; 0 = embed_dim
  Index vdim = 0;            ///< value input width; 0 = embed_dim
  bool bias = true;          ///< biases on the four projections
  double dropout = 0.0;      ///< attention-probability dropout in training mode, in [0, 1)
  Index rope_dim = 0;        ///< 0 = no rotary embedding; else rotate the first rope_dim dims of each q/k head
  double rope_base = 10000.0;  ///< RoPE frequency base (finite, > 0): theta_i = rope_base^(-2i/rope_dim)
  RopeStyle rope_style = RopeStyle::half;  ///< RoPE pairing: half (GPT-NeoX, Llama) or interleaved (GPT-J)
  bool alibi = false;        ///< add ALiBi with alibi_slopes(num_heads)
  double softcap = 0.0;      ///< > 0: cap every attention score at softcap tanh(s / softcap) (Gemma 2); 0 = off
  bool sinks = false;        ///< a learned sink logit per query head (gpt-oss): params().sinks (H), initially 0
};

/// \brief The module's parameters (or their gradients), nn.Linear layout. Biases are empty when !bias.
///
/// Shapes: q_weight (E, E), k_weight (Hkv*Dh, kdim), v_weight (Hkv*Dh, vdim), out_weight (E, E);
/// q_bias (E), k_bias (Hkv*Dh), v_bias (Hkv*Dh), out_bias (E).
/// \code
/// MhaParams<float>& P = mha.params();   // PyTorch: in_proj_weight is [q_weight; k_weight; v_weight]
/// P.out_bias.fill(0.1f);
/// \endcode
template <typename T>
struct MhaParams {
  /// \var q_weight
  /// (E, E): query projection, q = query q_weight^T + q_bias.
  /// \var k_weight
  /// (Hkv*Dh, kdim): key projection.
  /// \var v_weight
  /// (Hkv*Dh, vdim): value projection.
  /// \var out_weight
  /// (E, E): output projection, output = merged out_weight^T + out_bias (PyTorch's out_proj.weight).
  Tensor<T, 2> q_weight, k_weight, v_weight, out_weight;
  /// \var q_bias
  /// (E), or empty when the module has no biases.
  /// \var k_bias
  /// (Hkv*Dh), or empty when the module has no biases.
  /// \var v_bias
  /// (Hkv*Dh), or empty when the module has no biases.
  /// \var out_bias
  /// (E), or empty when the module has no biases (PyTorch's out_proj.bias).
  Tensor<T, 1> q_bias, k_bias, v_bias, out_bias;
  /// (H) with cfg.sinks: each query head's sink logit, which joins its softmax with no value; else empty.
  Tensor<T, 1> sinks;
};

/// \brief The parameters with every tensor converted to `To` (tensor_cast: to 16 bits rounded to nearest even; empty
/// biases stay empty): `params_cast<bfloat16>(mha.params())` is what MultiHeadAttention::step_with's 16-bit
/// overload reads.
template <typename To, typename T>
MhaParams<To> params_cast(const MhaParams<T>& p) {
  const auto cast = [](const auto& x) { return tensor_cast<To>(x); };
  return MhaParams<To>{cast(p.q_weight), cast(p.k_weight), cast(p.v_weight), cast(p.out_weight), cast(p.q_bias),
                       cast(p.k_bias),   cast(p.v_bias),   cast(p.out_bias), cast(p.sinks)};
}

/// \brief The keys and values of a fixed memory (an encoder's output), projected and split into heads once by
/// MultiHeadAttention::project_memory, for a cross-attention that many decode steps run over
/// (MultiHeadAttention::attend_memory_with).
template <typename T>
struct MemoryKeysValues {
  Tensor<T, 4> keys;    ///< (B, Hkv, Lk, Dh)
  Tensor<T, 4> values;  ///< (B, Hkv, Lk, Dh)
};

namespace detail {

/// The forward's q (after RoPE), k (after RoPE) and v, each head contiguous: q (B, H, Lq, Dh), k and v (B, Hkv, Lk,
/// Dh). Shared so that copies of a forward result stay valid: never written after the forward.
template <typename T>
struct ProjectedHeads {
  Tensor<T, 4> q, k, v;
};

/// PyTorch's _reset_parameters: Xavier-uniform q/k/v weights — over the stacked (3E, E) in_proj_weight when all three
/// are (E, E), else each on its own — and an out_proj drawn as nn.Linear does, U(-1/sqrt(E), 1/sqrt(E)); all biases
/// zero. `config` is normalised (num_kv_heads, kdim and vdim filled in).
template <typename T>
MhaParams<T> pytorch_initial_params(const MultiHeadAttentionConfig& config, std::uint64_t seed) {
  const Index e = config.embed_dim, kv = config.num_kv_heads * (e / config.num_heads);
  MhaParams<T> params;
  params.q_weight = Tensor<T, 2>({e, e});
  params.k_weight = Tensor<T, 2>({kv, config.kdim});
  params.v_weight = Tensor<T, 2>({kv, config.vdim});
  params.out_weight = Tensor<T, 2>({e, e});
  if (config.bias) {
    params.q_bias = Tensor<T, 1>(std::array<Index, 1>{e});
    params.k_bias = Tensor<T, 1>(std::array<Index, 1>{kv});
    params.v_bias = Tensor<T, 1>(std::array<Index, 1>{kv});
    params.out_bias = Tensor<T, 1>(std::array<Index, 1>{e});
  }
  if (config.sinks) params.sinks = Tensor<T, 1>(std::array<Index, 1>{config.num_heads});  // 0: no head prefers a sink
  std::mt19937_64 generator(seed);
  // Our own uniform draw: std::uniform_real_distribution differs between standard libraries.
  const auto fill_uniform = [&generator](Tensor<T, 2>& w, double bound) {
    for (Index n = 0; n < w.size(); ++n)
      w.data()[n] = static_cast<T>(bound * (2.0 * static_cast<double>(generator() >> 11) * 0x1.0p-53 - 1.0));
  };
  const auto xavier = [](Index fan_in, Index fan_out) { return std::sqrt(6.0 / static_cast<double>(fan_in + fan_out)); };
  const bool stacked = config.kdim == e && config.vdim == e && kv == e;
  fill_uniform(params.q_weight, stacked ? xavier(e, 3 * e) : xavier(e, e));
  fill_uniform(params.k_weight, stacked ? xavier(e, 3 * e) : xavier(config.kdim, kv));
  fill_uniform(params.v_weight, stacked ? xavier(e, 3 * e) : xavier(config.vdim, kv));
  fill_uniform(params.out_weight, 1.0 / std::sqrt(static_cast<double>(e)));
  return params;
}

}  // namespace detail

/// \brief What MultiHeadAttention::forward returns: the output, optional per-head weights, and what
/// the backward pass needs.
///
/// Shapes: output (B, Lq, E); weights (B, H, Lq, Lk) when opts.need_weights, else empty.
/// \code
/// AttentionOptions<float> opts;
/// opts.need_weights = true;
/// MhaForward<float> fwd = mha.forward(x, opts);   // x (B, L, E)
/// float w = fwd.weights(0, 2, 4, 1);              // batch 0, head 2: query 4 attends to key 1
/// \endcode
template <typename T>
struct MhaForward {
  Tensor<T, 3> output;   ///< (B, Lq, E): the module's output
  Tensor<T, 4> weights;  ///< (B, H, Lq, Lk): per-head attention probabilities when opts.need_weights, else empty

  /// \name Saved for the backward pass
  /// Views of the inputs. An input passed as a named tensor (or a view) is the caller's to keep alive until
  /// backward; one passed as a temporary Tensor was moved into `kept` by the forward.
  ///@{
  /// \var query
  /// (B, Lq, E): view of the query input.
  /// \var key
  /// (B, Lk, kdim): view of the key input.
  /// \var value
  /// (B, Lk, vdim): view of the value input.
  TensorView<const T, 3> query, key, value;
  /// Internal: the attention's q, k (after RoPE) and v, each head contiguous, (B, H, Lq, Dh) and (B, Hkv, Lk, Dh).
  std::shared_ptr<const detail::ProjectedHeads<T>> heads;
  AttentionForward<T> attention;      ///< out (B, H, Lq, Dh) and lse (B, H, Lq); weights moved to `weights`
  Tensor<T, 3> merged;                ///< merge_heads(attention.out), the input of the output projection
  AttentionOptions<T> options;        ///< the options the attention ran with (ALiBi, dropout filled in)
  /// Internal: the inputs that were passed as temporaries, moved here so that query, key and value stay valid
  /// until backward; shared, so that copies of this result stay valid too. Null for inputs the caller owns.
  std::array<std::shared_ptr<const Tensor<T, 3>>, 3> kept;
  ///@}
};

/// \brief What MultiHeadAttention::backward returns: input gradients d_query (B, Lq, E), d_key (B, Lk, kdim),
/// d_value (B, Lk, vdim) — for self-attention the gradient of x is their sum — and the parameter gradients
/// under the names and shapes of params().
///
/// Shapes: d_query (B, Lq, E), d_key (B, Lk, kdim), d_value (B, Lk, vdim); params as MhaParams.
/// \code
/// MhaForward<float> fwd = mha.forward(x);
/// MhaGradients<float> g = mha.backward(dout, fwd);   // dout (B, L, E)
/// // self-attention: dx = g.d_query + g.d_key + g.d_value; g.params.q_weight is (E, E)
/// \endcode
template <typename T>
struct MhaGradients {
  /// \var d_query
  /// (B, Lq, E): gradient of the query input.
  /// \var d_key
  /// (B, Lk, kdim): gradient of the key input.
  /// \var d_value
  /// (B, Lk, vdim): gradient of the value input.
  Tensor<T, 3> d_query, d_key, d_value;
  MhaParams<T> params;  ///< gradients of every parameter, same names and shapes as params()
};

}  // namespace selfattn
