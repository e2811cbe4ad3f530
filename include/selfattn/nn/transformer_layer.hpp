/// \file
/// TransformerLayer: PyTorch's nn.TransformerEncoderLayer(batch_first=True) with its backward, pre-norm or post-norm,
/// and the decoder-only (GPT-style: causal, pre-norm) variant with incremental decoding.
///
/// Dimension letters: B batch, L length, E embed dim, F feed-forward width.
///
/// Post-norm (norm_first = false, PyTorch's default and the original Transformer):
///   h = norm1(x + dropout(attention(x)))
///   y = norm2(h + dropout(ffn(h)))
/// Pre-norm (norm_first = true, GPT-2 and later):
///   h = x + dropout(attention(norm1(x)))
///   y = h + dropout(ffn(norm2(h)))
/// where attention is multi-head self-attention (MultiHeadAttention) and ffn = linear2(dropout(act(linear1))).
#pragma once

#include <selfattn/detail/dropout.hpp>
#include <selfattn/errors.hpp>
#include <selfattn/half_precision.hpp>
#include <selfattn/nn/activation.hpp>
#include <selfattn/nn/feed_forward.hpp>
#include <selfattn/nn/kv_cache.hpp>
#include <selfattn/nn/module_input.hpp>
#include <selfattn/nn/module_options.hpp>
#include <selfattn/nn/multihead.hpp>
#include <selfattn/nn/norm.hpp>
#include <selfattn/nn/residual_sublayer.hpp>
#include <selfattn/options.hpp>
#include <selfattn/tensor.hpp>

#include <array>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace selfattn {

/// \brief Configuration of a TransformerLayer; PyTorch's nn.TransformerEncoderLayer arguments, plus the norm kind,
/// SwiGLU and the decoder-only switch. The layer's constructor throws std::invalid_argument naming the field when the
/// configuration is invalid.
///
/// PyTorch's layer passes its `dropout` to the attention probabilities as well; here that rate is
/// `attention.dropout`, so set both to match PyTorch in training mode.
/// \code
/// TransformerLayerConfig cfg;
/// cfg.attention.embed_dim = 512;   // E
/// cfg.attention.num_heads = 8;
/// cfg.ffn_dim = 2048;              // F
/// cfg.norm_first = true;           // pre-norm
/// \endcode
struct TransformerLayerConfig {
  MultiHeadAttentionConfig attention;        ///< the self-attention (embed_dim, heads, GQA, RoPE, ALiBi, bias, dropout)
  Index ffn_dim = 2048;                      ///< F: hidden width of the feed-forward network (dim_feedforward)
  Activation activation = Activation::relu;  ///< relu, gelu, gelu_tanh or swiglu
  double dropout = 0.1;  ///< on the attention output, inside the FFN and on its output (training mode only)
  bool norm_first = false;                   ///< false: post-norm (PyTorch's default); true: pre-norm
  NormKind norm = NormKind::layer_norm;      ///< layer_norm or rms_norm
  double norm_eps = 1e-5;                    ///< eps of both norms (layer_norm_eps)
  bool bias = true;                          ///< biases of the FFN's linear layers and of LayerNorm (PyTorch's `bias`)
  bool causal = false;  ///< decoder-only: the self-attention is causal (top-left) whatever opts.causal says
};

/// \brief A decoder-only (GPT-style) layer: pre-norm, causal self-attention, GELU (tanh) feed-forward network of
/// width 4E, no dropout; RoPE or ALiBi go into `attention` as usual.
/// \code
/// TransformerLayerConfig cfg = decoder_layer_config(256, 4);   // E = 256, H = 4, F = 1024
/// cfg.attention.rope_dim = 64;                                 // rotary positions on the whole head
/// \endcode
inline TransformerLayerConfig decoder_layer_config(Index embed_dim, Index num_heads, Index ffn_dim = 0) {
  TransformerLayerConfig cfg;
  cfg.attention.embed_dim = embed_dim;
  cfg.attention.num_heads = num_heads;
  cfg.ffn_dim = ffn_dim > 0 ? ffn_dim : 4 * embed_dim;
  cfg.activation = Activation::gelu_tanh;
  cfg.dropout = 0.0;
  cfg.norm_first = true;
  cfg.causal = true;
  return cfg;
}

/// \brief The layer's parameters (or their gradients), under nn.TransformerEncoderLayer's names.
///
/// Shapes: self_attn as MhaParams; linear1_weight (Fz, E), linear1_bias (Fz), linear2_weight (E, F),
/// linear2_bias (E) with Fz = F (2F for SwiGLU); norm1/norm2 weight and bias (E). Biases are empty when !cfg.bias
/// (norm biases also for RMSNorm).
template <typename T>
struct TransformerLayerParams {
  MhaParams<T> self_attn;       ///< the self-attention (self_attn.in_proj_weight ... in PyTorch)
  Tensor<T, 2> linear1_weight;  ///< (Fz, E)
  Tensor<T, 1> linear1_bias;    ///< (Fz), or empty
  Tensor<T, 2> linear2_weight;  ///< (E, F)
  Tensor<T, 1> linear2_bias;    ///< (E), or empty
  Tensor<T, 1> norm1_weight;    ///< (E)
  Tensor<T, 1> norm1_bias;      ///< (E), or empty
  Tensor<T, 1> norm2_weight;    ///< (E)
  Tensor<T, 1> norm2_bias;      ///< (E), or empty
};

/// \brief The layer's parameters with every tensor converted to `To` (tensor_cast; empty biases stay empty):
/// `params_cast<bfloat16>(layer.params())` is what TransformerLayer::step_with's 16-bit overload reads.
template <typename To, typename T>
TransformerLayerParams<To> params_cast(const TransformerLayerParams<T>& p) {
  const auto cast = [](const auto& x) { return tensor_cast<To>(x); };
  return TransformerLayerParams<To>{params_cast<To>(p.self_attn), cast(p.linear1_weight), cast(p.linear1_bias),
                                    cast(p.linear2_weight),       cast(p.linear2_bias),   cast(p.norm1_weight),
                                    cast(p.norm1_bias),           cast(p.norm2_weight),   cast(p.norm2_bias)};
}

namespace detail {

/// What the layer's backward needs of its forward. Built once in place and shared (never moved after the attention's
/// forward has taken views of its tensors).
template <typename T>
struct TransformerLayerSaved {
  SavedInput<T> input;  ///< x
  SublayerSaved<T> attention_block, ffn_block;
  MhaForward<T> attention;  ///< the self-attention's forward
  Tensor<T, 3> h;           ///< the attention sublayer's output: the FFN sublayer's input
  FeedForwardSaved<T> ffn;
  T dropout_p = T(0);            ///< the layer's dropout rate in this forward (0 outside training)
  std::uint64_t seed = 0;        ///< opts.seed of the forward
};

/// The seeds of the layer's three dropout sites, derived from opts.seed (the attention probabilities use opts.seed).
enum class LayerDropoutSite : std::uint64_t { attention_output = 1, ffn_hidden = 2, ffn_output = 3 };
inline std::uint64_t layer_dropout_seed(std::uint64_t seed, LayerDropoutSite site) {
  return mix64(seed ^ (0x7f4a7c15ULL * static_cast<std::uint64_t>(site)));
}

// What every layer configuration has (TransformerLayerConfig, TransformerDecoderLayerConfig: the same field names),
// and the parts of a layer's parameters built and checked from it, shared by the encoder and the decoder layer.

/// The layer's feed-forward network.
template <typename Config>
FeedForwardConfig layer_ffn_config(const Config& c) {
  return {c.attention.embed_dim, c.ffn_dim, c.activation, c.dropout, c.bias};
}

/// How the layer normalises its sublayers (norm biases only for LayerNorm with cfg.bias).
template <typename T, typename Config>
SublayerNorm<T> layer_norm_of(const Config& c) {
  return {c.norm, static_cast<T>(c.norm_eps), c.norm_first, c.bias && c.norm == NormKind::layer_norm};
}

/// The layer's own fields, std::invalid_argument naming the field (the attentions' fields are checked by
/// MultiHeadAttention's constructor).
template <typename Config>
void check_layer_config(const char* function, const Config& c) {
  if (c.attention.embed_dim >= 1) check_feed_forward_config(function, "cfg.", layer_ffn_config(c));
  check_norm_eps(function, "cfg.norm_eps", c.norm_eps);
}

/// The self-attention's options: top-left causal when cfg.causal asks for it and opts ask for no causal mask.
template <typename T, typename Config>
AttentionOptions<T> layer_attention_options(const Config& c, const AttentionOptions<T>& opts) {
  AttentionOptions<T> o = opts;
  if (c.causal && o.causal == Causal::none) o.causal = Causal::top_left;
  return o;
}

/// A norm's parameters as a new layer has them: weight 1 (E), bias 0 (E) when the norm has one.
template <typename T>
void init_norm_params(Index embed_dim, bool has_bias, Tensor<T, 1>& weight, Tensor<T, 1>& bias) {
  weight = Tensor<T, 1>(std::array<Index, 1>{embed_dim});
  weight.fill(T(1));
  if (has_bias) bias = Tensor<T, 1>(std::array<Index, 1>{embed_dim});
}

/// A new layer's FFN, drawn as nn.Linear is from a seed derived from `seed`, and its norm1 and norm2, into `p`.
template <typename T, typename Config, typename LayerParams>
void init_ffn_and_norms(const Config& c, std::uint64_t seed, LayerParams& p) {
  FeedForward<T> ffn(layer_ffn_config(c), seed ^ 0x5eedf00dULL);
  p.linear1_weight = std::move(ffn.params().linear1_weight);
  p.linear1_bias = std::move(ffn.params().linear1_bias);
  p.linear2_weight = std::move(ffn.params().linear2_weight);
  p.linear2_bias = std::move(ffn.params().linear2_bias);
  const bool has_bias = layer_norm_of<T>(c).has_bias;
  init_norm_params(c.attention.embed_dim, has_bias, p.norm1_weight, p.norm1_bias);
  init_norm_params(c.attention.embed_dim, has_bias, p.norm2_weight, p.norm2_bias);
}

/// The shapes of the FFN's and of norm1's and norm2's parameters (ShapeError naming params().<name>).
template <typename Config, typename LayerParams>
void check_ffn_and_norm_params(const char* function, const Config& c, const LayerParams& p) {
  check_feed_forward_params(function, "params().", layer_ffn_config(c), p.linear1_weight, p.linear1_bias,
                            p.linear2_weight, p.linear2_bias);
  const Index e = c.attention.embed_dim;
  const bool has_bias = c.bias && c.norm == NormKind::layer_norm;
  check_norm_param(function, "params().norm1_weight", p.norm1_weight, true, e);
  check_norm_param(function, "params().norm1_bias", p.norm1_bias, has_bias, e);
  check_norm_param(function, "params().norm2_weight", p.norm2_weight, true, e);
  check_norm_param(function, "params().norm2_bias", p.norm2_bias, has_bias, e);
}

// A layer's feed-forward network as the f of its last sublayer, for every layer whose parameters hold linear1_* and
// linear2_* (TransformerLayerParams, TransformerDecoderLayerParams).

template <template <typename> class Params, typename P>
FeedForwardWeights<P> layer_ffn_weights(const Params<P>& p) {
  return {p.linear1_weight.view(), p.linear1_bias.view(), p.linear2_weight.view(), p.linear2_bias.view()};
}

/// ffn(in) into a new tensor, its hidden dropout (rate p) keyed by the layer's seed, what its backward reads in
/// `saved`.
template <typename T, template <typename> class Params>
Tensor<T, 3> layer_ffn_forward(Activation activation, T p, std::uint64_t seed, const Params<T>& params,
                               const TensorView<const T, 3>& in, FeedForwardSaved<T>& saved) {
  Tensor<T, 3> out(in.shape());
  feed_forward_forward<T>(activation, p, layer_dropout_seed(seed, LayerDropoutSite::ffn_hidden), in,
                          layer_ffn_weights(params), saved, out.view());
  return out;
}

/// d in for dy = d loss / d ffn(in); the FFN's parameter gradients into the linear fields of `grads`.
template <typename T, template <typename> class Params>
Tensor<T, 3> layer_ffn_backward(Activation activation, T p, std::uint64_t seed, bool bias, const Params<T>& params,
                                const TensorView<const T, 3>& in, const FeedForwardSaved<T>& saved,
                                const TensorView<const T, 3>& dy, Params<T>& grads) {
  FeedForwardParams<T> g;
  Tensor<T, 3> dx = feed_forward_backward<T>(activation, p, layer_dropout_seed(seed, LayerDropoutSite::ffn_hidden), in,
                                             layer_ffn_weights(params), saved, dy, bias, g);
  grads.linear1_weight = std::move(g.linear1_weight);
  grads.linear1_bias = std::move(g.linear1_bias);
  grads.linear2_weight = std::move(g.linear2_weight);
  grads.linear2_bias = std::move(g.linear2_bias);
  return dx;
}

/// ffn(in) at inference, the weights stored as P (T, or 16 bits).
template <typename T, typename P, template <typename> class Params>
Tensor<T, 3> layer_ffn_inference(Activation activation, const Params<P>& params, const TensorView<const T, 3>& in) {
  Tensor<T, 3> out(in.shape());
  StackedProjection<T> scratch;
  feed_forward_inference<T, P>(activation, in, layer_ffn_weights(params), out.view(), scratch);
  return out;
}

}  // namespace detail

/// \brief What TransformerLayer::forward returns: the output, the attention weights when asked for, and what the
/// backward needs (shared: copies of this result stay valid).
template <typename T>
struct TransformerLayerForward {
  Tensor<T, 3> output;   ///< (B, L, E)
  Tensor<T, 4> weights;  ///< (B, H, L, L) per-head attention probabilities when opts.need_weights, else empty
  std::shared_ptr<const detail::TransformerLayerSaved<T>> saved;  ///< Internal: saved for backward
};

/// \brief What TransformerLayer::backward returns: d_input (B, L, E) and the gradients of every parameter under the
/// names and shapes of params().
template <typename T>
struct TransformerLayerGradients {
  Tensor<T, 3> d_input;             ///< (B, L, E)
  TransformerLayerParams<T> params;  ///< gradients, same names and shapes as params()
};

/// \brief One transformer layer: self-attention and a feed-forward network, each with dropout and a residual
/// connection, normalised before (pre-norm) or after (post-norm). Equal to PyTorch's
/// nn.TransformerEncoderLayer(batch_first=True); parameters load from its state dict (io/transformer_state_dict.hpp).
///
/// Shapes: forward(x (B, L, E), opts) -> output (B, L, E); step(x_new (B, Lnew, E), cache) -> (B, Lnew, E).
/// `opts` are the attention's options (causal, key_lengths, allowed, bias, windows, need_weights, seed); dropout rates
/// come from the configuration, in training mode only, so opts.dropout_p must be 0 or cfg.attention.dropout (another
/// value throws). step takes the options MultiHeadAttention::step takes. forward, backward and step are const: one
/// layer serves many threads.
/// \code
/// TransformerLayer<float> layer(cfg);           // seed 0
/// AttentionOptions<float> opts;
/// opts.key_lengths = {7, 5};                    // key padding
/// auto fwd = layer.forward(x, opts);            // x (2, 7, E)
/// auto g = layer.backward(dout, fwd);           // g.d_input, g.params.linear1_weight, ...
/// \endcode
template <typename T>
class TransformerLayer {
  static_assert(std::is_floating_point_v<T>, "TransformerLayer<T>: T is float or double");

 public:
  /// The attention initialised as MultiHeadAttention(cfg.attention, seed) is, the FFN as nn.Linear is, the norms to
  /// weight 1 and bias 0.
  explicit TransformerLayer(const TransformerLayerConfig& config, std::uint64_t seed = 0)
      : config_(checked(config)), attention_(config_.attention, seed) {
    config_.attention = attention_.config();  // with its defaults filled in
    params_.self_attn = std::move(attention_.params());  // the layer keeps them; attention_ runs them (forward_with)
    detail::init_ffn_and_norms<T>(config_, seed, params_);
  }

  /// The configuration, with the attention's defaults filled in.
  const TransformerLayerConfig& config() const { return config_; }
  Index embed_dim() const { return config_.attention.embed_dim; }  ///< E
  /// The parameters, writable (e.g. to load PyTorch weights); keep their shapes, and do not change them between a
  /// forward and its backward.
  TransformerLayerParams<T>& params() { return params_; }
  /// \overload
  const TransformerLayerParams<T>& params() const { return params_; }
  /// Dropout (cfg.dropout and cfg.attention.dropout) applies only in training mode; the default is false.
  void set_training(bool training) {
    training_ = training;
    attention_.set_training(training);
  }
  bool training() const { return training_; }  ///< whether dropout is on

  /// \brief The layer on x (B, L, E) with the attention options `opts`.
  ///
  /// Checks every argument first (ShapeError / std::invalid_argument naming it). A temporary Tensor x is moved into
  /// the result; a named one (and the mask tensors of opts) stay the caller's to keep alive until backward.
  template <typename X>
  TransformerLayerForward<T> forward(X&& x, const AttentionOptions<T>& opts = {}) const {
    return forward_with(params_, std::forward<X>(x), opts);
  }

  /// \brief Gradients of a scalar loss given dout = d loss / d output (B, L, E) of the forward `f`; the parameters
  /// must be unchanged since that forward. The forward's walk in reverse.
  template <typename DO>
  TransformerLayerGradients<T> backward(const DO& dout, const TransformerLayerForward<T>& f) const {
    return backward_with(params_, dout, f);
  }

  /// \brief A key/value cache for incremental decoding of `batch` sequences with this layer (see step); `S` the
  /// storage type of its keys and values (T, or bfloat16 / float16: MultiHeadAttention::make_cache).
  template <typename S = T>
  KVCache<T, S> make_cache(Index batch, const CachePolicy& policy = {}) const {
    return attention_.template make_cache<S>(batch, policy);
  }

  /// \brief Incremental decoding: the layer on the new tokens x_new (B, Lnew, E), their keys and values appended to
  /// the cache, attending causally over everything cached (MultiHeadAttention::step). Feeding a sequence in pieces
  /// gives the rows of one forward with Causal::top_left; no dropout. If step throws on its arguments, the cache is
  /// unchanged.
  template <typename X, typename S>
  Tensor<detail::activation_of<T, X>, 3> step(const X& x_new, KVCache<T, S>& cache, const AttentionOptions<T>& opts = {},
                                              const std::vector<Index>& new_tokens = {}) const {
    return step_with(params_, x_new, cache, opts, new_tokens);
  }

  /// \brief forward(x, opts) with `parameters` in place of params().
  ///
  /// The layer's configuration run with parameters held elsewhere: a TransformerStack keeps every layer's parameters
  /// and runs them through one layer of the configuration. `parameters` must have the shapes of params();
  /// backward_with must get the parameters its forward_with ran with.
  template <typename X>
  TransformerLayerForward<T> forward_with(const TransformerLayerParams<T>& parameters, X&& x,
                                          const AttentionOptions<T>& opts = {}) const {
    TransformerLayerForward<T> f;
    if constexpr (detail::check_module_arguments<T, X>()) {
      detail::SavedInput<T> input = detail::save_input<T>(std::forward<X>(x));
      check_input(forward_name, "x", input.view);
      check_params(forward_name, parameters);
      detail::check_module_dropout(forward_name, opts, config_.attention.dropout, "cfg.attention.dropout", training_);
      auto saved = std::make_shared<detail::TransformerLayerSaved<T>>();
      saved->input = std::move(input);
      f.output = run_forward(parameters, *saved, detail::layer_attention_options(config_, opts));
      f.weights = std::move(saved->attention.weights);
      f.saved = std::move(saved);
    }
    return f;
  }

  /// backward(dout, f) with the `parameters` that forward_with ran with.
  template <typename DO>
  TransformerLayerGradients<T> backward_with(const TransformerLayerParams<T>& parameters, const DO& dout,
                                             const TransformerLayerForward<T>& f) const {
    TransformerLayerGradients<T> g;
    if constexpr (detail::check_module_arguments<T, DO>()) {
      if (!f.saved) detail::throw_invalid(backward_name, "fwd", "is not the result of a forward call");
      detail::check_shape<3>(backward_name, "dout", detail::const_view(dout).shape(), f.output.shape());
      check_params(backward_name, parameters);
      run_backward(parameters, *f.saved, detail::const_view(dout), g);
    }
    return g;
  }

  /// step(x_new, cache, opts, new_tokens) with `parameters` in place of params().
  template <typename X, typename S>
  Tensor<detail::activation_of<T, X>, 3> step_with(const TransformerLayerParams<T>& parameters, const X& x_new,
                                                   KVCache<T, S>& cache, const AttentionOptions<T>& opts = {},
                                                   const std::vector<Index>& new_tokens = {}) const {
    return checked_step<S, T>(parameters, x_new, cache, opts, new_tokens);
  }

  /// \brief Verifies a tree of drafts in one step (MultiHeadAttention::step_tree, docs/decoding.md): the layer's
  /// step with the attention's tree mask and depths; every draft's row equals steps along the path to it. Keep the
  /// accepted path with cache.keep_draft_path afterwards. Throws as step and MultiHeadAttention::step_tree (naming
  /// TransformerLayer::step_tree or the attention's step_tree); the cache is unchanged then.
  template <typename X, typename S>
  Tensor<T, 3> step_tree(const X& x_draft, KVCache<T, S>& cache, const DraftTree& tree) const {
    return step_tree_with(params_, x_draft, cache, tree);
  }

  /// step_tree(x_draft, cache, tree) with `parameters` in place of params().
  template <typename X, typename S>
  Tensor<T, 3> step_tree_with(const TransformerLayerParams<T>& parameters, const X& x_draft, KVCache<T, S>& cache,
                              const DraftTree& tree) const {
    static_assert(std::is_same_v<detail::activation_of<T, X>, T>, "TransformerLayer::step_tree: x_draft of T");
    const TensorView<const T, 3> x = detail::const_view(x_draft);
    check_input("TransformerLayer::step_tree", "x_draft", x);
    check_params("TransformerLayer::step_tree", parameters);
    return run_inference(parameters, x, [&](const TensorView<const T, 3>& in) {
      return attention_.step_tree_with(parameters.self_attn, in, cache, tree);
    });
  }

  /// \brief step with 16-bit parameters (P = bfloat16 or float16, the layer float): inference over a KV cache with
  /// every weight and bias read in 16 bits (`params_cast<bfloat16>(layer.params())` makes them).
  ///
  /// Activations, norms, attention, activation functions and every sum are float, as in step. A decode step (fewer
  /// than 16 new rows) reads each projection's weights once, in place, widening them in registers: half the bytes of
  /// float weights; 16 rows or more widen each weight matrix once and run float GEMMs. Either way the output is bitwise
  /// that of step_with on float parameters holding the same (rounded) values. Shapes, checks and errors as step (the
  /// parameters named like params()'s). docs/half_precision.md.
  /// \code
  /// const TransformerLayerParams<bfloat16> weights = params_cast<bfloat16>(layer.params());
  /// auto cache = layer.make_cache<bfloat16>(1);
  /// Tensor<float, 3> y = layer.step_with(weights, prompt, cache);
  /// \endcode
  template <typename P, typename X, typename S, std::enable_if_t<is_half_width_v<P>, int> = 0>
  Tensor<detail::activation_of<T, X>, 3> step_with(const TransformerLayerParams<P>& parameters, const X& x_new,
                                                   KVCache<T, S>& cache, const AttentionOptions<T>& opts = {},
                                                   const std::vector<Index>& new_tokens = {}) const {
    static_assert(std::is_same_v<T, float>, "TransformerLayer: 16-bit parameters run in a float layer");
    return checked_step<S, P>(parameters, x_new, cache, opts, new_tokens);
  }

 private:
  static constexpr const char* forward_name = "TransformerLayer::forward";
  static constexpr const char* backward_name = "TransformerLayer::backward";
  static constexpr const char* step_name = "TransformerLayer::step";

  /// step_with on parameters stored as P (T, or 16 bits): every argument checked, then the walk. 16-bit activations
  /// are widened exactly, run as T, and the output rounded once.
  template <typename S, typename P, typename X>
  Tensor<detail::activation_of<T, X>, 3> checked_step(const TransformerLayerParams<P>& parameters, const X& x_new,
                                                      KVCache<T, S>& cache, const AttentionOptions<T>& opts,
                                                      const std::vector<Index>& new_tokens) const {
    if constexpr (!detail::check_inference_arguments<T, X>()) {
      return {};
    } else if constexpr (!std::is_same_v<detail::activation_of<T, X>, T>) {
      const Tensor<T, 3> wide = tensor_cast<T>(x_new);
      return tensor_cast<detail::activation_of<T, X>>(checked_step<S, P>(parameters, wide, cache, opts, new_tokens));
    } else {
      const TensorView<const T, 3> x = detail::const_view(x_new);
      check_input(step_name, "x_new", x);
      check_params(step_name, parameters);
      detail::check_step_options(step_name, opts);
      return run_step(parameters, x, cache, opts, new_tokens);
    }
  }

  static TransformerLayerConfig checked(const TransformerLayerConfig& c) {
    detail::check_layer_config("TransformerLayer", c);
    return c;
  }

  void check_input(const char* function, const char* name, const TensorView<const T, 3>& x) const {
    detail::check_shape<3>(function, name, x.shape(), {detail::any_extent, detail::any_extent, embed_dim()});
  }

  template <typename P>
  void check_params(const char* function, const TransformerLayerParams<P>& p) const {
    detail::check_ffn_and_norm_params(function, config_, p);
    // the attention's parameters are checked by the attention (naming params().<name> of self_attn)
  }

  detail::SublayerNorm<T> norm() const { return detail::layer_norm_of<T>(config_); }

  /// The forward's walk (see the file comment), everything the backward needs into `s`.
  Tensor<T, 3> run_forward(const TransformerLayerParams<T>& p, detail::TransformerLayerSaved<T>& s,
                           const AttentionOptions<T>& opts) const {
    using detail::LayerDropoutSite;
    s.dropout_p = training_ ? static_cast<T>(config_.dropout) : T(0);
    s.seed = opts.seed;
    const auto seed = [&](LayerDropoutSite site) { return detail::layer_dropout_seed(s.seed, site); };
    s.h = detail::sublayer_forward<T>(norm(), p.norm1_weight, p.norm1_bias, s.input.view, s.dropout_p,
                                      seed(LayerDropoutSite::attention_output), s.attention_block,
                                      [&](const TensorView<const T, 3>& in) {
                                        s.attention = attention_.forward_with(p.self_attn, in, opts);
                                        return s.attention.output;  // a copy: the forward result keeps its own
                                      });
    return detail::sublayer_forward<T>(
        norm(), p.norm2_weight, p.norm2_bias, s.h.view(), s.dropout_p, seed(LayerDropoutSite::ffn_output), s.ffn_block,
        [&](const TensorView<const T, 3>& in) {
          return detail::layer_ffn_forward<T>(config_.activation, s.dropout_p, s.seed, p, in, s.ffn);
        });
  }

  /// The forward's walk in reverse: the FFN's sublayer, then the attention's.
  void run_backward(const TransformerLayerParams<T>& p, const detail::TransformerLayerSaved<T>& s,
                    const TensorView<const T, 3>& dy, TransformerLayerGradients<T>& g) const {
    using detail::LayerDropoutSite;
    const auto seed = [&](LayerDropoutSite site) { return detail::layer_dropout_seed(s.seed, site); };
    TransformerLayerParams<T>& dp = g.params;
    const Tensor<T, 3> dh = detail::sublayer_backward<T>(
        norm(), p.norm2_weight, s.h.view(), s.dropout_p, seed(LayerDropoutSite::ffn_output), s.ffn_block, dy,
        dp.norm2_weight, dp.norm2_bias, [&](const Tensor<T, 3>& d_ffn) {
          const TensorView<const T, 3> in = norm().first ? s.ffn_block.normed.view() : s.h.view();
          return detail::layer_ffn_backward<T>(config_.activation, s.dropout_p, s.seed, config_.bias, p, in, s.ffn,
                                               d_ffn.view(), dp);
        });
    g.d_input = detail::sublayer_backward<T>(
        norm(), p.norm1_weight, s.input.view, s.dropout_p, seed(LayerDropoutSite::attention_output), s.attention_block,
        dh.view(), dp.norm1_weight, dp.norm1_bias, [&](const Tensor<T, 3>& d_attention) {
          MhaGradients<T> ga = attention_.backward_with(p.self_attn, d_attention, s.attention);
          dp.self_attn = std::move(ga.params);
          return std::move(ga.d_query) + ga.d_key + ga.d_value;  // x is query, key and value
        });
  }

  /// The forward's walk for new tokens, the attention through the cache; nothing saved, no dropout. Parameters
  /// stored as P: T, or 16 bits (read by the projections as they are, widened for the norms).
  template <typename S, typename P>
  Tensor<T, 3> run_step(const TransformerLayerParams<P>& p, const TensorView<const T, 3>& x, KVCache<T, S>& cache,
                        const AttentionOptions<T>& opts, const std::vector<Index>& new_tokens) const {
    return run_inference(p, x, [&](const TensorView<const T, 3>& in) {
      return attention_.step_with(p.self_attn, in, cache, opts, new_tokens);
    });
  }

  /// The inference walk around an attention call `attend` (a step, or a tree step): attention sublayer, FFN sublayer.
  template <typename P, typename Attend>
  Tensor<T, 3> run_inference(const TransformerLayerParams<P>& p, const TensorView<const T, 3>& x,
                             Attend&& attend) const {
    const Tensor<T, 3> h = detail::sublayer_inference<T, P>(norm(), p.norm1_weight, p.norm1_bias, x, attend);
    return detail::sublayer_inference<T, P>(
        norm(), p.norm2_weight, p.norm2_bias, h.view(),
        [&](const TensorView<const T, 3>& in) { return detail::layer_ffn_inference<T, P>(config_.activation, p, in); });
  }

  TransformerLayerConfig config_;
  MultiHeadAttention<T> attention_;  // runs params_.self_attn; its own params() are empty
  TransformerLayerParams<T> params_;
  bool training_ = false;
};

}  // namespace selfattn
