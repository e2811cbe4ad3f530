/// \file
/// TransformerDecoderLayer: PyTorch's nn.TransformerDecoderLayer(batch_first=True) with its backward, pre-norm or
/// post-norm, and decoding with a self-attention KV cache over a memory projected once.
///
/// Dimension letters: B batch, L target length, Lm memory length, E embed dim, M memory width, F feed-forward width.
///
/// Post-norm (norm_first = false, PyTorch's default and the original Transformer):
///   h1 = norm1(x + dropout(self_attention(x)))
///   h2 = norm2(h1 + dropout(cross_attention(h1, memory)))
///   y  = norm3(h2 + dropout(ffn(h2)))
/// Pre-norm (norm_first = true):
///   h1 = x + dropout(self_attention(norm1(x)))
///   h2 = h1 + dropout(cross_attention(norm2(h1), memory))
///   y  = h2 + dropout(ffn(norm3(h2)))
/// The memory (an encoder's output) enters the cross-attention as keys and values as it is, without a norm.
#pragma once

#include <selfattn/errors.hpp>
#include <selfattn/nn/activation.hpp>
#include <selfattn/nn/feed_forward.hpp>
#include <selfattn/nn/kv_cache.hpp>
#include <selfattn/nn/module_input.hpp>
#include <selfattn/nn/module_options.hpp>
#include <selfattn/nn/multihead.hpp>
#include <selfattn/nn/multihead_checks.hpp>
#include <selfattn/nn/norm.hpp>
#include <selfattn/nn/residual_sublayer.hpp>
#include <selfattn/nn/transformer_layer.hpp>
#include <selfattn/options.hpp>
#include <selfattn/tensor.hpp>

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace selfattn {

/// \brief Configuration of a TransformerDecoderLayer: PyTorch's nn.TransformerDecoderLayer arguments, plus the norm
/// kind, SwiGLU, grouped-query heads and a memory of another width. The constructor throws std::invalid_argument
/// naming the field when it is invalid.
///
/// The cross-attention takes embed_dim, num_heads, num_kv_heads, bias and dropout from `attention`, its keys and
/// values from a memory of width memory_dim, and no positions (RoPE and ALiBi are the self-attention's only).
/// \code
/// TransformerDecoderLayerConfig cfg;
/// cfg.attention.embed_dim = 512;   // E
/// cfg.attention.num_heads = 8;
/// cfg.ffn_dim = 2048;              // F
/// \endcode
struct TransformerDecoderLayerConfig {
  MultiHeadAttentionConfig attention;        ///< the self-attention (embed_dim, heads, GQA, RoPE, ALiBi, bias, dropout)
  Index memory_dim = 0;                      ///< M: the memory's width (the cross-attention's kdim and vdim); 0: E
  Index ffn_dim = 2048;                      ///< F: hidden width of the feed-forward network (dim_feedforward)
  Activation activation = Activation::relu;  ///< relu, gelu, gelu_tanh or swiglu
  double dropout = 0.1;                      ///< on each sublayer's output and inside the FFN (training mode only)
  bool norm_first = false;                   ///< false: post-norm (PyTorch's default); true: pre-norm
  NormKind norm = NormKind::layer_norm;      ///< layer_norm or rms_norm
  double norm_eps = 1e-5;                    ///< eps of the three norms (layer_norm_eps)
  bool bias = true;                          ///< biases of the FFN's linear layers and of LayerNorm (PyTorch's `bias`)
  /// The self-attention is causal (top-left) whatever opts.causal says: a decoder's rows see only earlier rows.
  /// PyTorch's layer is causal only when given tgt_mask (or tgt_is_causal); set false to pass masks yourself.
  bool causal = true;
};

/// \brief The decoder layer's parameters (or their gradients), under nn.TransformerDecoderLayer's names.
///
/// Shapes: self_attn and multihead_attn as MhaParams (the cross-attention's k and v weights (Hkv Dh, M));
/// linear1_weight (Fz, E), linear1_bias (Fz), linear2_weight (E, F), linear2_bias (E) with Fz = F (2F for SwiGLU);
/// norm1..norm3 weight and bias (E). Biases are empty when !cfg.bias (norm biases also for RMSNorm).
template <typename T>
struct TransformerDecoderLayerParams {
  MhaParams<T> self_attn;       ///< the causal self-attention
  MhaParams<T> multihead_attn;  ///< the cross-attention over the memory (PyTorch's name)
  Tensor<T, 2> linear1_weight;  ///< (Fz, E)
  Tensor<T, 1> linear1_bias;    ///< (Fz), or empty
  Tensor<T, 2> linear2_weight;  ///< (E, F)
  Tensor<T, 1> linear2_bias;    ///< (E), or empty
  Tensor<T, 1> norm1_weight;    ///< (E): before or after the self-attention
  Tensor<T, 1> norm1_bias;      ///< (E), or empty
  Tensor<T, 1> norm2_weight;    ///< (E): before or after the cross-attention
  Tensor<T, 1> norm2_bias;      ///< (E), or empty
  Tensor<T, 1> norm3_weight;    ///< (E): before or after the FFN
  Tensor<T, 1> norm3_bias;      ///< (E), or empty
};

namespace detail {

/// What the decoder layer's backward needs of its forward. Built once in place and shared (never moved after the
/// attentions' forwards have taken views of its tensors).
template <typename T>
struct DecoderLayerSaved {
  SavedInput<T> input;   ///< x
  SavedInput<T> memory;  ///< the memory
  SublayerSaved<T> self_block, cross_block, ffn_block;
  MhaForward<T> self_attention, cross_attention;
  Tensor<T, 3> h1, h2;  ///< the outputs of the first two sublayers: the inputs of the next
  FeedForwardSaved<T> ffn;
  T dropout_p = T(0);      ///< the layer's dropout rate in this forward (0 outside training)
  std::uint64_t seed = 0;  ///< opts.seed of the forward
};

/// The decoder layer's cross-attention: the self-attention's heads, bias and dropout over keys and values of width
/// memory_dim (0: embed_dim), and no positions.
inline MultiHeadAttentionConfig decoder_cross_attention_config(const TransformerDecoderLayerConfig& c) {
  MultiHeadAttentionConfig cross;
  cross.embed_dim = c.attention.embed_dim;
  cross.num_heads = c.attention.num_heads;
  cross.num_kv_heads = c.attention.num_kv_heads;
  cross.kdim = cross.vdim = c.memory_dim;
  cross.bias = c.attention.bias;
  cross.dropout = c.attention.dropout;
  return cross;
}

template <typename P>
inline constexpr bool is_decoder_params = false;
template <typename T>
inline constexpr bool is_decoder_params<TransformerDecoderLayerParams<T>> = true;

/// The seed of the cross-attention output's dropout (the other three sites are TransformerLayer's).
inline std::uint64_t cross_output_dropout_seed(std::uint64_t seed) { return mix64(seed ^ (0x7f4a7c15ULL * 4)); }

}  // namespace detail

/// \brief What TransformerDecoderLayer::forward returns: the output, the attention weights when asked for, and what the
/// backward needs (shared: copies of this result stay valid).
template <typename T>
struct TransformerDecoderLayerForward {
  Tensor<T, 3> output;         ///< (B, L, E)
  Tensor<T, 4> self_weights;   ///< (B, H, L, L) when opts.need_weights, else empty
  Tensor<T, 4> cross_weights;  ///< (B, H, L, Lm) when memory_opts.need_weights, else empty: which source rows each
                               ///< target row reads
  std::shared_ptr<const detail::DecoderLayerSaved<T>> saved;  ///< Internal: saved for backward
};

/// \brief What TransformerDecoderLayer::backward returns: the gradients of the target input, of the memory and of every
/// parameter (under the names and shapes of params()).
template <typename T>
struct TransformerDecoderLayerGradients {
  Tensor<T, 3> d_input;                     ///< (B, L, E)
  Tensor<T, 3> d_memory;                    ///< (B, Lm, M)
  TransformerDecoderLayerParams<T> params;  ///< gradients, same names and shapes as params()
};

/// \brief One decoder layer of an encoder-decoder transformer: causal self-attention, cross-attention over a memory
/// (the encoder's output) and a feed-forward network, each with dropout and a residual connection, normalised before
/// (pre-norm) or after (post-norm). Equal to PyTorch's nn.TransformerDecoderLayer(batch_first=True) given a causal
/// tgt_mask.
///
/// Shapes: forward(x (B, L, E), memory (B, Lm, M), opts, memory_opts) -> output (B, L, E). `opts` are the
/// self-attention's options (key_lengths for target padding, masks, need_weights, seed), `memory_opts` the
/// cross-attention's (key_lengths for source padding, masks, need_weights, its dropout seed). Dropout rates come from
/// the configuration, in training mode only. forward, backward and step are const: one layer serves many threads.
/// \code
/// TransformerDecoderLayer<float> layer(cfg, /*seed=*/1);
/// AttentionOptions<float> source;
/// source.key_lengths = {9, 6};                        // the sources' real lengths
/// auto fwd = layer.forward(target, memory, {}, source);   // target (2, L, E), memory (2, 9, E)
/// auto g = layer.backward(dout, fwd);                 // g.d_input, g.d_memory, g.params.multihead_attn.q_weight, ...
/// \endcode
template <typename T>
class TransformerDecoderLayer {
  static_assert(std::is_floating_point_v<T>, "TransformerDecoderLayer<T>: T is float or double");

 public:
  /// The attentions initialised as MultiHeadAttention is (each with its own draw), the FFN as nn.Linear is, the norms
  /// to weight 1 and bias 0.
  explicit TransformerDecoderLayer(const TransformerDecoderLayerConfig& config, std::uint64_t seed = 0)
      : config_(checked(config)),
        self_attention_(config_.attention, seed),
        cross_attention_(detail::decoder_cross_attention_config(config_), seed ^ 0xc7055a77e11ULL) {
    config_.attention = self_attention_.config();  // with its defaults filled in
    config_.memory_dim = cross_attention_.config().kdim;
    params_.self_attn = std::move(self_attention_.params());  // the layer keeps them; the modules run them (_with)
    params_.multihead_attn = std::move(cross_attention_.params());
    detail::init_ffn_and_norms<T>(config_, seed, params_);
    detail::init_norm_params(embed_dim(), norm().has_bias, params_.norm3_weight, params_.norm3_bias);
  }

  /// The configuration, with the attention's defaults and memory_dim filled in.
  const TransformerDecoderLayerConfig& config() const { return config_; }
  Index embed_dim() const { return config_.attention.embed_dim; }  ///< E
  /// The parameters, writable (e.g. to load PyTorch weights); keep their shapes, and do not change them between a
  /// forward and its backward.
  TransformerDecoderLayerParams<T>& params() { return params_; }
  /// \overload
  const TransformerDecoderLayerParams<T>& params() const { return params_; }
  /// Dropout (cfg.dropout and cfg.attention.dropout) applies only in training mode; the default is false.
  void set_training(bool training) {
    training_ = training;
    self_attention_.set_training(training);
    cross_attention_.set_training(training);
  }
  bool training() const { return training_; }  ///< whether dropout is on

  /// \brief The layer on the target x (B, L, E) attending to `memory` (B, Lm, M).
  ///
  /// Checks every argument first (ShapeError / std::invalid_argument naming it): x, memory, the parameters, and both
  /// options against their attentions (opts.dropout_p and memory_opts.dropout_p 0 or cfg.attention.dropout). A
  /// temporary Tensor x or memory is moved into the result; a named one (and the mask tensors of either options) stays
  /// the caller's to keep alive until backward.
  template <typename X, typename M>
  TransformerDecoderLayerForward<T> forward(X&& x, M&& memory, const AttentionOptions<T>& opts = {},
                                            const AttentionOptions<T>& memory_opts = {}) const {
    return forward_with(params_, std::forward<X>(x), std::forward<M>(memory), opts, memory_opts);
  }

  /// \brief Gradients of a scalar loss given dout = d loss / d output (B, L, E) of the forward `f`: of x, of the memory
  /// and of every parameter. The parameters must be unchanged since that forward.
  template <typename DO>
  TransformerDecoderLayerGradients<T> backward(const DO& dout, const TransformerDecoderLayerForward<T>& f) const {
    return backward_with(params_, dout, f);
  }

  /// \brief A key/value cache of the self-attention for decoding `batch` sequences (see step); `S` the storage type of
  /// its keys and values (T, or bfloat16 / float16: MultiHeadAttention::make_cache).
  template <typename S = T>
  KVCache<T, S> make_cache(Index batch, const CachePolicy& policy = {}) const {
    return self_attention_.template make_cache<S>(batch, policy);
  }

  /// \brief The memory (B, Lm, M) as the cross-attention's keys and values, projected once for every step of a decode
  /// (MultiHeadAttention::project_memory).
  template <typename M>
  MemoryKeysValues<T> project_memory(const M& memory) const {
    return project_memory_with(params_, memory);
  }

  /// \brief Incremental decoding: the layer on the new target rows x_new (B, Lnew, E), their self-attention keys and
  /// values appended to `cache`, attending causally over everything cached and to the projected memory.
  ///
  /// Feeding a target in pieces gives the rows of one forward (no dropout). `opts` as MultiHeadAttention::step takes
  /// them, `memory_opts` as MultiHeadAttention::attend_memory (the source's key_lengths, masks over Lm). Every argument
  /// is checked before the cache is touched: if step throws, the cache is unchanged.
  /// \code
  /// auto cache = layer.make_cache(1);
  /// const MemoryKeysValues<float> source = layer.project_memory(memory);   // once
  /// Tensor<float, 3> y = layer.step(start_token, cache, source);           // (1, 1, E)
  /// y = layer.step(next_token, cache, source);
  /// \endcode
  template <typename X>
  Tensor<T, 3> step(const X& x_new, KVCache<T>& cache, const MemoryKeysValues<T>& memory,
                    const AttentionOptions<T>& opts = {}, const AttentionOptions<T>& memory_opts = {},
                    const std::vector<Index>& new_tokens = {}) const {
    return step_with(params_, x_new, cache, memory, opts, memory_opts, new_tokens);
  }

  /// forward(x, memory, opts, memory_opts) with `parameters` in place of params() (a stack keeps every layer's).
  template <typename X, typename M>
  TransformerDecoderLayerForward<T> forward_with(const TransformerDecoderLayerParams<T>& parameters, X&& x, M&& memory,
                                                 const AttentionOptions<T>& opts = {},
                                                 const AttentionOptions<T>& memory_opts = {}) const {
    TransformerDecoderLayerForward<T> f;
    if constexpr (detail::check_module_arguments<T, X, M>()) {
      auto saved = std::make_shared<detail::DecoderLayerSaved<T>>();
      saved->input = detail::save_input<T>(std::forward<X>(x));
      saved->memory = detail::save_input<T>(std::forward<M>(memory));
      check_forward(parameters, saved->input.view, saved->memory.view, opts, memory_opts);
      f.output = run_forward(parameters, *saved, detail::layer_attention_options(config_, opts), memory_opts);
      f.self_weights = std::move(saved->self_attention.weights);
      f.cross_weights = std::move(saved->cross_attention.weights);
      f.saved = std::move(saved);
    }
    return f;
  }

  /// backward(dout, f) with the `parameters` that forward_with ran with.
  template <typename DO>
  TransformerDecoderLayerGradients<T> backward_with(const TransformerDecoderLayerParams<T>& parameters, const DO& dout,
                                                    const TransformerDecoderLayerForward<T>& f) const {
    TransformerDecoderLayerGradients<T> g;
    if constexpr (detail::check_module_arguments<T, DO>()) {
      if (!f.saved) detail::throw_invalid(backward_name, "fwd", "is not the result of a forward call");
      detail::check_shape<3>(backward_name, "dout", detail::const_view(dout).shape(), f.output.shape());
      check_params(backward_name, parameters);
      run_backward(parameters, *f.saved, detail::const_view(dout), g);
    }
    return g;
  }

  /// project_memory(memory) with `parameters` in place of params().
  template <typename M>
  MemoryKeysValues<T> project_memory_with(const TransformerDecoderLayerParams<T>& parameters, const M& memory) const {
    MemoryKeysValues<T> projected;
    if constexpr (detail::check_module_arguments<T, M>()) {
      const TensorView<const T, 3> m = detail::const_view(memory);
      detail::check_shape<3>(project_memory_name, "memory", m.shape(),
                             {detail::any_extent, detail::any_extent, config_.memory_dim});
      projected = cross_attention_.project_memory_with(parameters.multihead_attn, m, m);
    }
    return projected;
  }

  /// step(x_new, cache, memory, opts, memory_opts, new_tokens) with `parameters` in place of params().
  template <typename X>
  Tensor<T, 3> step_with(const TransformerDecoderLayerParams<T>& parameters, const X& x_new, KVCache<T>& cache,
                         const MemoryKeysValues<T>& memory, const AttentionOptions<T>& opts = {},
                         const AttentionOptions<T>& memory_opts = {}, const std::vector<Index>& new_tokens = {}) const {
    Tensor<T, 3> y;
    if constexpr (detail::check_module_arguments<T, X>()) {
      const TensorView<const T, 3> x = detail::const_view(x_new);
      check_input(step_name, "x_new", x);
      check_params(step_name, parameters);
      // The cross-attention's checks before the self-attention's step appends to the cache.
      detail::check_mha_attend_memory(cross_attention_.config(), parameters.multihead_attn, x, memory, memory_opts,
                                      step_name);
      detail::check_step_options(step_name, opts);
      y = run_step(parameters, x, cache, memory, opts, memory_opts, new_tokens);
    }
    return y;
  }

 private:
  static constexpr const char* forward_name = "TransformerDecoderLayer::forward";
  static constexpr const char* backward_name = "TransformerDecoderLayer::backward";
  static constexpr const char* step_name = "TransformerDecoderLayer::step";
  static constexpr const char* project_memory_name = "TransformerDecoderLayer::project_memory";

  static TransformerDecoderLayerConfig checked(const TransformerDecoderLayerConfig& c) {
    const char* fn = "TransformerDecoderLayer";
    detail::check_layer_config(fn, c);
    if (c.memory_dim < 0)
      detail::throw_invalid(fn, "cfg.memory_dim", "expected >= 0, got " + std::to_string(c.memory_dim));
    return c;
  }

  detail::SublayerNorm<T> norm() const { return detail::layer_norm_of<T>(config_); }

  void check_input(const char* function, const char* name, const TensorView<const T, 3>& x) const {
    detail::check_shape<3>(function, name, x.shape(), {detail::any_extent, detail::any_extent, embed_dim()});
  }

  void check_params(const char* function, const TransformerDecoderLayerParams<T>& p) const {
    detail::check_ffn_and_norm_params(function, config_, p);
    detail::check_norm_param(function, "params().norm3_weight", p.norm3_weight, true, embed_dim());
    detail::check_norm_param(function, "params().norm3_bias", p.norm3_bias, norm().has_bias, embed_dim());
    detail::check_mha_params(self_attention_.config(), p.self_attn, function);
    detail::check_mha_params(cross_attention_.config(), p.multihead_attn, function);
  }

  /// Every check of forward before any work: x, memory, the parameters and both options.
  void check_forward(const TransformerDecoderLayerParams<T>& p, const TensorView<const T, 3>& x,
                     const TensorView<const T, 3>& memory, const AttentionOptions<T>& opts,
                     const AttentionOptions<T>& memory_opts) const {
    check_input(forward_name, "x", x);
    detail::check_shape<3>(forward_name, "memory", memory.shape(), {x.dim(0), detail::any_extent, config_.memory_dim});
    check_params(forward_name, p);
    const double rate = config_.attention.dropout;
    detail::check_module_dropout(forward_name, opts, rate, "cfg.attention.dropout", training_);
    detail::check_module_dropout(forward_name, memory_opts, rate, "cfg.attention.dropout", training_);
    const Index heads = config_.attention.num_heads;
    detail::validate_options(forward_name, detail::layer_attention_options(config_, opts), x.dim(0), heads, x.dim(1),
                             x.dim(1));
    detail::validate_options(forward_name, memory_opts, x.dim(0), heads, x.dim(1), memory.dim(1));
  }

  /// The forward's walk (see the file comment), everything the backward needs into `s`.
  Tensor<T, 3> run_forward(const TransformerDecoderLayerParams<T>& p, detail::DecoderLayerSaved<T>& s,
                           const AttentionOptions<T>& opts, const AttentionOptions<T>& memory_opts) const {
    using detail::LayerDropoutSite;
    s.dropout_p = training_ ? static_cast<T>(config_.dropout) : T(0);
    s.seed = opts.seed;
    const auto seed = [&](LayerDropoutSite site) { return detail::layer_dropout_seed(s.seed, site); };
    const TensorView<const T, 3> memory = s.memory.view;
    s.h1 = detail::sublayer_forward<T>(norm(), p.norm1_weight, p.norm1_bias, s.input.view, s.dropout_p,
                                       seed(LayerDropoutSite::attention_output), s.self_block,
                                       [&](const TensorView<const T, 3>& in) {
                                         s.self_attention = self_attention_.forward_with(p.self_attn, in, opts);
                                         return s.self_attention.output;
                                       });
    s.h2 = detail::sublayer_forward<T>(
        norm(), p.norm2_weight, p.norm2_bias, s.h1.view(), s.dropout_p, detail::cross_output_dropout_seed(s.seed),
        s.cross_block, [&](const TensorView<const T, 3>& in) {
          s.cross_attention = cross_attention_.forward_with(p.multihead_attn, in, memory, memory, memory_opts);
          return s.cross_attention.output;
        });
    return detail::sublayer_forward<T>(
        norm(), p.norm3_weight, p.norm3_bias, s.h2.view(), s.dropout_p, seed(LayerDropoutSite::ffn_output), s.ffn_block,
        [&](const TensorView<const T, 3>& in) {
          return detail::layer_ffn_forward<T>(config_.activation, s.dropout_p, s.seed, p, in, s.ffn);
        });
  }

  /// The forward's walk in reverse: the FFN's sublayer, the cross-attention's (whose keys and values give d_memory),
  /// the self-attention's.
  void run_backward(const TransformerDecoderLayerParams<T>& p, const detail::DecoderLayerSaved<T>& s,
                    const TensorView<const T, 3>& dy, TransformerDecoderLayerGradients<T>& g) const {
    using detail::LayerDropoutSite;
    const auto seed = [&](LayerDropoutSite site) { return detail::layer_dropout_seed(s.seed, site); };
    TransformerDecoderLayerParams<T>& dp = g.params;
    const Tensor<T, 3> dh2 = detail::sublayer_backward<T>(
        norm(), p.norm3_weight, s.h2.view(), s.dropout_p, seed(LayerDropoutSite::ffn_output), s.ffn_block, dy,
        dp.norm3_weight, dp.norm3_bias, [&](const Tensor<T, 3>& d_ffn) {
          const TensorView<const T, 3> in = norm().first ? s.ffn_block.normed.view() : s.h2.view();
          return detail::layer_ffn_backward<T>(config_.activation, s.dropout_p, s.seed, config_.bias, p, in, s.ffn,
                                               d_ffn.view(), dp);
        });
    const Tensor<T, 3> dh1 = detail::sublayer_backward<T>(
        norm(), p.norm2_weight, s.h1.view(), s.dropout_p, detail::cross_output_dropout_seed(s.seed), s.cross_block,
        dh2.view(), dp.norm2_weight, dp.norm2_bias, [&](const Tensor<T, 3>& d_cross) {
          MhaGradients<T> ga = cross_attention_.backward_with(p.multihead_attn, d_cross, s.cross_attention);
          dp.multihead_attn = std::move(ga.params);
          g.d_memory = std::move(ga.d_key) + ga.d_value;  // the memory is both keys and values
          return std::move(ga.d_query);
        });
    g.d_input = detail::sublayer_backward<T>(
        norm(), p.norm1_weight, s.input.view, s.dropout_p, seed(LayerDropoutSite::attention_output), s.self_block,
        dh1.view(), dp.norm1_weight, dp.norm1_bias, [&](const Tensor<T, 3>& d_self) {
          MhaGradients<T> ga = self_attention_.backward_with(p.self_attn, d_self, s.self_attention);
          dp.self_attn = std::move(ga.params);
          return std::move(ga.d_query) + ga.d_key + ga.d_value;  // x is query, key and value
        });
  }

  /// The forward's walk for new rows: the self-attention through the cache, the cross-attention over the projected
  /// memory; nothing saved, no dropout.
  Tensor<T, 3> run_step(const TransformerDecoderLayerParams<T>& p, const TensorView<const T, 3>& x, KVCache<T>& cache,
                        const MemoryKeysValues<T>& memory, const AttentionOptions<T>& opts,
                        const AttentionOptions<T>& memory_opts, const std::vector<Index>& new_tokens) const {
    const Tensor<T, 3> h1 = detail::sublayer_inference<T, T>(
        norm(), p.norm1_weight, p.norm1_bias, x, [&](const TensorView<const T, 3>& in) {
          return self_attention_.step_with(p.self_attn, in, cache, opts, new_tokens);
        });
    const Tensor<T, 3> h2 = detail::sublayer_inference<T, T>(
        norm(), p.norm2_weight, p.norm2_bias, h1.view(), [&](const TensorView<const T, 3>& in) {
          return cross_attention_.attend_memory_with(p.multihead_attn, in, memory, memory_opts);
        });
    return detail::sublayer_inference<T, T>(
        norm(), p.norm3_weight, p.norm3_bias, h2.view(),
        [&](const TensorView<const T, 3>& in) { return detail::layer_ffn_inference<T, T>(config_.activation, p, in); });
  }

  TransformerDecoderLayerConfig config_;
  MultiHeadAttention<T> self_attention_;   // runs params_.self_attn; its own params() are empty
  MultiHeadAttention<T> cross_attention_;  // runs params_.multihead_attn
  TransformerDecoderLayerParams<T> params_;
  bool training_ = false;
};

}  // namespace selfattn
