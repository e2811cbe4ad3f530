/// \file
/// TransformerDecoderStack: N decoder layers of one configuration attending to one memory, and an optional final norm,
/// forward, backward and decoding through every layer; PyTorch's nn.TransformerDecoder(layer, num_layers, norm).
///
/// Shapes: x (B, L, E), memory (B, Lm, M) -> layer 0 -> ... -> layer N-1 -> [final norm] -> y (B, L, E); every layer
/// reads the same memory, so the memory's gradient is the sum of the layers'.
#pragma once

#include <selfattn/errors.hpp>
#include <selfattn/nn/kv_cache.hpp>
#include <selfattn/nn/module_input.hpp>
#include <selfattn/nn/module_options.hpp>
#include <selfattn/nn/multihead_checks.hpp>
#include <selfattn/nn/norm.hpp>
#include <selfattn/nn/residual_sublayer.hpp>
#include <selfattn/nn/transformer_decoder_layer.hpp>
#include <selfattn/nn/transformer_stack.hpp>
#include <selfattn/options.hpp>
#include <selfattn/tensor.hpp>

#include <array>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace selfattn {

/// \brief Configuration of a TransformerDecoderStack; the constructor throws std::invalid_argument naming the field
/// when it is invalid.
/// \code
/// TransformerDecoderStackConfig cfg;
/// cfg.layer.attention.embed_dim = 256;
/// cfg.layer.attention.num_heads = 4;
/// cfg.layer.norm_first = true;
/// cfg.num_layers = 3;
/// cfg.final_norm = true;   // a pre-norm stack ends in a norm
/// \endcode
struct TransformerDecoderStackConfig {
  TransformerDecoderLayerConfig layer;  ///< every layer's configuration
  Index num_layers = 1;                 ///< N >= 1
  bool final_norm = false;              ///< a norm (cfg.layer.norm, cfg.layer.norm_eps) after the last layer
};

/// \brief The decoder stack's parameters (or their gradients): each layer's, then the final norm's (PyTorch's
/// layers.i.* and norm.weight, norm.bias).
template <typename T>
struct TransformerDecoderStackParams {
  std::vector<TransformerDecoderLayerParams<T>> layers;  ///< N layers
  Tensor<T, 1> norm_weight;                              ///< (E): the final norm's weight; empty without a final norm
  Tensor<T, 1> norm_bias;  ///< (E): the final norm's bias; empty without a final norm or for RMSNorm or !bias
};

/// \brief What TransformerDecoderStack::forward returns: the output and each layer's forward (for the backward and
/// for each layer's cross-attention weights, when memory_opts.need_weights).
template <typename T>
struct TransformerDecoderStackForward {
  Tensor<T, 3> output;                                    ///< (B, L, E)
  std::vector<TransformerDecoderLayerForward<T>> layers;  ///< layers[i].output feeds layer i + 1
  detail::NormStatistics<T> final_norm;                   ///< Internal: the final norm's statistics
};

/// \brief What TransformerDecoderStack::backward returns: the gradients of x, of the memory (summed over the layers)
/// and of every parameter.
template <typename T>
struct TransformerDecoderStackGradients {
  Tensor<T, 3> d_input;                     ///< (B, L, E)
  Tensor<T, 3> d_memory;                    ///< (B, Lm, M)
  TransformerDecoderStackParams<T> params;  ///< gradients, same names and shapes as params()
};

/// \brief The memory as every layer's cross-attention reads it in decoding: each layer's keys and values, projected
/// once (TransformerDecoderStack::project_memory).
template <typename T>
struct TransformerDecoderStackMemory {
  std::vector<MemoryKeysValues<T>> layers;  ///< layer i's keys and values, (B, Hkv, Lm, Dh) each
};

/// \brief N decoder layers of one configuration over one memory, and an optional final norm: the decoder of an
/// encoder-decoder transformer.
///
/// Every layer runs with the same `opts` and `memory_opts` (checked as TransformerDecoderLayer checks them); layer i's
/// dropout is keyed by seeds derived from the options' seeds and i. forward, backward and step are const.
/// \code
/// TransformerDecoderStack<float> decoder(cfg, /*seed=*/100);
/// auto fwd = decoder.forward(target, encoded, {}, source);     // encoded: the encoder's output
/// auto g = decoder.backward(dout, fwd);                       // g.d_memory is the encoder's dout
/// auto cache = decoder.make_cache(1);
/// const auto memory = decoder.project_memory(encoded);        // once per source
/// Tensor<float, 3> y = decoder.step(start, cache, memory, {}, source);   // then one row at a time
/// \endcode
template <typename T>
class TransformerDecoderStack {
 public:
  /// Layer i initialised as TransformerDecoderLayer(cfg.layer, seed + i) is; the final norm to weight 1, bias 0.
  explicit TransformerDecoderStack(const TransformerDecoderStackConfig& config, std::uint64_t seed = 0)
      : config_(config), layer_(config.layer, seed) {
    if (config_.num_layers < 1)
      detail::throw_invalid("TransformerDecoderStack", "cfg.num_layers",
                            "expected >= 1, got " + std::to_string(config_.num_layers));
    config_.layer = layer_.config();
    params_.layers.reserve(static_cast<std::size_t>(config_.num_layers));
    params_.layers.push_back(std::move(layer_.params()));  // the stack keeps them; layer_ runs them (_with)
    for (Index i = 1; i < config_.num_layers; ++i)
      params_.layers.push_back(
          std::move(TransformerDecoderLayer<T>(config_.layer, seed + static_cast<std::uint64_t>(i)).params()));
    if (config_.final_norm) {
      params_.norm_weight = Tensor<T, 1>(std::array<Index, 1>{embed_dim()});
      params_.norm_weight.fill(T(1));
      if (final_norm().has_bias) params_.norm_bias = Tensor<T, 1>(std::array<Index, 1>{embed_dim()});
    }
  }

  const TransformerDecoderStackConfig& config() const { return config_; }  ///< with the defaults filled in
  Index embed_dim() const { return config_.layer.attention.embed_dim; }    ///< E
  Index num_layers() const { return config_.num_layers; }                  ///< N
  /// The parameters, writable (keep their shapes and the number of layers).
  TransformerDecoderStackParams<T>& params() { return params_; }
  /// \overload
  const TransformerDecoderStackParams<T>& params() const { return params_; }
  /// Dropout applies only in training mode; the default is false.
  void set_training(bool training) { layer_.set_training(training); }
  bool training() const { return layer_.training(); }  ///< whether dropout is on

  /// \brief The stack on the target x (B, L, E) attending to `memory` (B, Lm, M). Temporary Tensors are moved into
  /// the result; named ones (and the masks of both options) stay the caller's to keep alive until backward.
  template <typename X, typename M>
  TransformerDecoderStackForward<T> forward(X&& x, M&& memory, const AttentionOptions<T>& opts = {},
                                            const AttentionOptions<T>& memory_opts = {}) const {
    TransformerDecoderStackForward<T> f;
    if constexpr (detail::check_module_arguments<T, X, M>()) {
      check_params(forward_name);
      // Layer 0 keeps the memory (moved in when temporary); the others view layer 0's copy.
      f.layers.reserve(params_.layers.size());
      AttentionOptions<T> layer_opts = opts, layer_memory_opts = memory_opts;
      for (std::size_t i = 0; i < params_.layers.size(); ++i) {
        layer_opts.seed = detail::stack_layer_seed(opts.seed, i);
        layer_memory_opts.seed = detail::stack_layer_seed(memory_opts.seed, i);
        if (i == 0) {
          f.layers.push_back(layer_.forward_with(params_.layers[0], std::forward<X>(x), std::forward<M>(memory),
                                                 layer_opts, layer_memory_opts));
        } else {
          const TensorView<const T, 3> shared_memory = f.layers[0].saved->memory.view;
          f.layers.push_back(layer_.forward_with(params_.layers[i], Tensor<T, 3>(f.layers[i - 1].output), shared_memory,
                                                 layer_opts, layer_memory_opts));
        }
      }
      const Tensor<T, 3>& last = f.layers.back().output;
      f.output = config_.final_norm ? detail::norm_inference<T, T>(config_.layer.norm, final_norm().eps, last.view(),
                                                                   params_.norm_weight, params_.norm_bias, f.final_norm)
                                    : last;
    }
    return f;
  }

  /// \brief Gradients given dout = d loss / d output (B, L, E) of the forward `f`: the layers' backwards in reverse,
  /// the memory's gradient summed over them.
  template <typename DO>
  TransformerDecoderStackGradients<T> backward(const DO& dout, const TransformerDecoderStackForward<T>& f) const {
    TransformerDecoderStackGradients<T> g;
    if constexpr (detail::check_module_arguments<T, DO>()) {
      if (f.layers.size() != params_.layers.size())
        detail::throw_invalid(backward_name, "fwd", "is not the result of this stack's forward");
      detail::check_shape<3>(backward_name, "dout", detail::const_view(dout).shape(), f.output.shape());
      check_params(backward_name);
      Tensor<T, 3> dy(detail::const_view(dout));
      if (config_.final_norm)  // y = norm(h):  dh = norm'(dy)
        dy = detail::norm_backward<T>(final_norm(), f.layers.back().output.view(), f.final_norm, params_.norm_weight,
                                      dy.view(), g.params.norm_weight, g.params.norm_bias);
      g.params.layers.resize(params_.layers.size());
      for (std::size_t i = params_.layers.size(); i-- > 0;) {
        TransformerDecoderLayerGradients<T> layer = layer_.backward_with(params_.layers[i], dy, f.layers[i]);
        g.params.layers[i] = std::move(layer.params);
        if (g.d_memory.empty())
          g.d_memory = std::move(layer.d_memory);
        else
          g.d_memory += layer.d_memory;  // every layer reads the memory
        dy = std::move(layer.d_input);
      }
      g.d_input = std::move(dy);
    }
    return g;
  }

  /// \brief The self-attention caches of every layer for decoding `batch` sequences (TransformerStackCache: one
  /// KVCache per layer).
  TransformerStackCache<T> make_cache(Index batch, const CachePolicy& policy = {}) const {
    TransformerStackCache<T> cache;
    for (Index i = 0; i < config_.num_layers; ++i) cache.layers.push_back(layer_.make_cache(batch, policy));
    return cache;
  }

  /// \brief The memory (B, Lm, M) as every layer's cross-attention reads it, projected once for a whole decode.
  template <typename M>
  TransformerDecoderStackMemory<T> project_memory(const M& memory) const {
    TransformerDecoderStackMemory<T> projected;
    if constexpr (detail::check_module_arguments<T, M>()) {
      check_params(project_memory_name);
      for (const TransformerDecoderLayerParams<T>& layer : params_.layers)
        projected.layers.push_back(layer_.project_memory_with(layer, memory));
    }
    return projected;
  }

  /// \brief Decoding through every layer: x_new (B, Lnew, E) -> (B, Lnew, E), each layer's self-attention keys and
  /// values appended to its cache, each attending to its projected memory. Feeding a target in pieces gives the rows of
  /// one forward. Every argument is checked before any layer steps: if step throws on its arguments the caches are
  /// unchanged; a keep-all cache is also rolled back when a later layer runs out of memory.
  template <typename X>
  Tensor<T, 3> step(const X& x_new, TransformerStackCache<T>& cache, const TransformerDecoderStackMemory<T>& memory,
                    const AttentionOptions<T>& opts = {}, const AttentionOptions<T>& memory_opts = {},
                    const std::vector<Index>& new_tokens = {}) const {
    Tensor<T, 3> y;
    if constexpr (detail::check_module_arguments<T, X>()) {
      const TensorView<const T, 3> x = detail::const_view(x_new);
      check_params(step_name);
      detail::check_stack_cache(step_name, config_.num_layers, embed_dim(), x, cache);
      check_memory(x, memory, memory_opts);
      detail::check_step_options(step_name, opts);
      detail::step_every_layer(cache, [&](std::size_t i) {
        const TensorView<const T, 3> in = i == 0 ? x : detail::const_view(y);
        y = layer_.step_with(params_.layers[i], in, cache.layers[i], memory.layers[i], opts, memory_opts, new_tokens);
      });
      if (config_.final_norm) {
        detail::NormStatistics<T> stats;
        y = detail::norm_inference<T, T>(config_.layer.norm, final_norm().eps, y.view(), params_.norm_weight,
                                         params_.norm_bias, stats);
      }
    }
    return y;
  }

 private:
  static constexpr const char* forward_name = "TransformerDecoderStack::forward";
  static constexpr const char* backward_name = "TransformerDecoderStack::backward";
  static constexpr const char* step_name = "TransformerDecoderStack::step";
  static constexpr const char* project_memory_name = "TransformerDecoderStack::project_memory";

  detail::SublayerNorm<T> final_norm() const {
    return {config_.layer.norm, static_cast<T>(config_.layer.norm_eps), false,
            config_.layer.bias && config_.layer.norm == NormKind::layer_norm};
  }

  /// The stack's own shapes (each layer's parameters are checked by the layer as it runs them).
  void check_params(const char* function) const {
    if (static_cast<Index>(params_.layers.size()) != config_.num_layers)
      detail::throw_invalid(
          function, "params().layers",
          "expected " + std::to_string(config_.num_layers) + " layers, got " + std::to_string(params_.layers.size()));
    const Index e = embed_dim();
    detail::check_norm_param(function, "params().norm_weight", params_.norm_weight, config_.final_norm, e);
    detail::check_norm_param(function, "params().norm_bias", params_.norm_bias,
                             config_.final_norm && final_norm().has_bias, e);
  }

  /// Every layer's projected memory and the memory options, before any layer steps.
  void check_memory(const TensorView<const T, 3>& x, const TransformerDecoderStackMemory<T>& memory,
                    const AttentionOptions<T>& memory_opts) const {
    if (static_cast<Index>(memory.layers.size()) != config_.num_layers)
      detail::throw_invalid(step_name, "memory",
                            "holds " + std::to_string(memory.layers.size()) + " layers, the stack has " +
                                std::to_string(config_.num_layers) + " (use project_memory)");
    const MultiHeadAttentionConfig cross = detail::decoder_cross_attention_config(config_.layer);
    for (std::size_t i = 0; i < memory.layers.size(); ++i)
      detail::check_mha_attend_memory(cross, params_.layers[i].multihead_attn, x, memory.layers[i], memory_opts,
                                      step_name);
  }

  TransformerDecoderStackConfig config_;
  TransformerDecoderLayer<T> layer_;  // runs every layer's parameters; its own params() are empty
  TransformerDecoderStackParams<T> params_;
};

}  // namespace selfattn
