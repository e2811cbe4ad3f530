/// \file
/// TransformerStack: N transformer layers of one configuration and an optional final norm, forward, backward and
/// incremental decoding through every layer; PyTorch's nn.TransformerEncoder(layer, num_layers, norm).
///
/// Shapes: x (B, L, E) -> layer 0 -> ... -> layer N-1 -> [final norm] -> y (B, L, E).
#pragma once

#include <selfattn/detail/dropout.hpp>
#include <selfattn/errors.hpp>
#include <selfattn/half_precision.hpp>
#include <selfattn/nn/kv_cache.hpp>
#include <selfattn/nn/module_input.hpp>
#include <selfattn/nn/module_options.hpp>
#include <selfattn/nn/norm.hpp>
#include <selfattn/nn/residual_sublayer.hpp>
#include <selfattn/nn/transformer_layer.hpp>
#include <selfattn/options.hpp>
#include <selfattn/tensor.hpp>

#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace selfattn {

/// \brief Configuration of a TransformerStack. The constructor throws std::invalid_argument naming the field when it
/// is invalid.
/// \code
/// TransformerStackConfig cfg;
/// cfg.layer = decoder_layer_config(256, 4);   // GPT-style layers
/// cfg.num_layers = 4;
/// cfg.final_norm = true;                      // a norm after the last layer, as pre-norm models have
/// \endcode
struct TransformerStackConfig {
  TransformerLayerConfig layer;  ///< every layer's configuration
  Index num_layers = 1;          ///< N >= 1
  bool final_norm = false;       ///< a norm (cfg.layer.norm, cfg.layer.norm_eps) after the last layer
};

/// \brief The stack's parameters (or their gradients): each layer's, then the final norm's (PyTorch's layers.i.*
/// and norm.weight, norm.bias).
template <typename T>
struct TransformerStackParams {
  std::vector<TransformerLayerParams<T>> layers;  ///< N layers
  Tensor<T, 1> norm_weight;  ///< (E): the final norm's weight; empty without a final norm
  Tensor<T, 1> norm_bias;    ///< (E): the final norm's bias; empty without a final norm or for RMSNorm or !bias
};

/// \brief The stack's parameters with every tensor converted to `To` (tensor_cast; empty ones stay empty):
/// `params_cast<bfloat16>(model.params())` is what TransformerStack::step_with reads in 16 bits.
template <typename To, typename T>
TransformerStackParams<To> params_cast(const TransformerStackParams<T>& p) {
  TransformerStackParams<To> result;
  result.layers.reserve(p.layers.size());
  for (const TransformerLayerParams<T>& layer : p.layers) result.layers.push_back(params_cast<To>(layer));
  result.norm_weight = tensor_cast<To>(p.norm_weight);
  result.norm_bias = tensor_cast<To>(p.norm_bias);
  return result;
}

/// \brief What TransformerStack::forward returns: the output and each layer's forward (for the backward).
template <typename T>
struct TransformerStackForward {
  Tensor<T, 3> output;                                ///< (B, L, E)
  std::vector<TransformerLayerForward<T>> layers;     ///< each layer's forward; layers[i].output feeds layer i + 1
  detail::NormStatistics<T> final_norm;               ///< Internal: the final norm's statistics
};

/// \brief What TransformerStack::backward returns: d_input (B, L, E) and every parameter's gradient.
template <typename T>
struct TransformerStackGradients {
  Tensor<T, 3> d_input;             ///< (B, L, E)
  TransformerStackParams<T> params;  ///< gradients, same names and shapes as params()
};

/// \brief The key/value caches of a stack, one per layer (TransformerStack::make_cache); S the storage type of
/// their keys and values (T, or bfloat16 / float16 with T = float).
template <typename T, typename S = T>
struct TransformerStackCache {
  std::vector<KVCache<T, S>> layers;  ///< layer i's cache

  /// Tokens cached so far (the longest sequence), the same in every layer.
  Index length() const { return layers.empty() ? 0 : layers.front().length(); }
  /// Bytes held by the keys and values of every layer.
  std::size_t memory_bytes() const {
    std::size_t bytes = 0;
    for (const KVCache<T, S>& c : layers) bytes += c.memory_bytes();
    return bytes;
  }
  /// Room for `tokens` tokens per sequence in every layer (see KVCache::reserve).
  void reserve(Index tokens) {
    for (KVCache<T, S>& c : layers) c.reserve(tokens);
  }
  /// Forgets every token of every layer.
  void clear() {
    for (KVCache<T, S>& c : layers) c.clear();
  }
  /// After TransformerStack::step_tree, keeps only the accepted drafts of sequence b in every layer (see
  /// KVCache::keep_draft_path and its errors). The layers hold the same lengths and policy (steps keep them so),
  /// so an argument that fails, fails on layer 0, before any layer changes.
  void keep_draft_path(Index b, Index draft_start, const std::vector<Index>& path) {
    for (KVCache<T, S>& c : layers) c.keep_draft_path(b, draft_start, path);
  }
};

namespace detail {

/// Layer i's dropout seed in a stack: independent streams per layer from the one opts.seed.
inline std::uint64_t stack_layer_seed(std::uint64_t seed, std::size_t i) {
  return mix64(seed + 0x9e3779b97f4a7c15ULL * (static_cast<std::uint64_t>(i) + 1));
}

/// A stack's caches must be one per layer, made alike and holding the same sequences, for x_new (B, Lnew, E):
/// checked before any layer steps, so that an argument error leaves every cache as it was.
template <typename T, typename S>
void check_stack_cache(const char* function, Index num_layers, Index embed_dim, const TensorView<const T, 3>& x,
                       const TransformerStackCache<T, S>& cache) {
  if (static_cast<Index>(cache.layers.size()) != num_layers)
    throw_invalid(function, "cache",
                  "holds " + std::to_string(cache.layers.size()) + " layers, the stack has " +
                      std::to_string(num_layers) + " (use make_cache)");
  check_shape<3>(function, "x_new", x.shape(), {cache.layers.front().batch(), any_extent, embed_dim});
  const KVCache<T, S>& first = cache.layers.front();
  for (std::size_t i = 1; i < cache.layers.size(); ++i) {
    const KVCache<T, S>& c = cache.layers[i];
    if (c.batch() != first.batch() || c.kv_heads() != first.kv_heads() || c.head_dim() != first.head_dim() ||
        c.lengths() != first.lengths() || c.policy().capacity != first.policy().capacity ||
        c.policy().window != first.policy().window || c.policy().sink_tokens != first.policy().sink_tokens)
      throw_invalid(function, "cache.layers[" + std::to_string(i) + "]",
                    "differs from layer 0's cache (shape, lengths or policy); use make_cache");
  }
}

/// Runs step_layer(i) for every layer in order; if one throws, the keep-all caches of the layers before it go back to
/// the lengths they had (an evicting cache cannot: its arguments were checked before any layer stepped).
template <typename T, typename S, typename StepLayer>
void step_every_layer(TransformerStackCache<T, S>& cache, StepLayer&& step_layer) {
  std::vector<std::vector<Index>> lengths_before;
  for (const KVCache<T, S>& c : cache.layers) lengths_before.push_back(c.lengths());
  std::size_t i = 0;
  try {
    for (; i < cache.layers.size(); ++i) step_layer(i);
  } catch (...) {  // layers before i appended already: a keep-all cache goes back to where it was
    for (std::size_t j = 0; j < i; ++j)
      if (!cache.layers[j].policy().evicts())
        for (std::size_t b = 0; b < lengths_before[j].size(); ++b)
          cache.layers[j].truncate(static_cast<Index>(b), lengths_before[j][b]);
    throw;
  }
}

}  // namespace detail

/// \brief N transformer layers of one configuration and an optional final norm.
///
/// Shapes: forward(x (B, L, E), opts) -> output (B, L, E); step(x_new (B, Lnew, E), cache) -> (B, Lnew, E).
/// Every layer attends with the same `opts` (checked as TransformerLayer checks them: opts.dropout_p 0 or
/// cfg.layer.attention.dropout; step's options as MultiHeadAttention::step's); layer i's dropout is keyed by a seed
/// derived from opts.seed and i.
/// forward, backward and step are const.
/// \code
/// TransformerStack<float> model(cfg, /*seed=*/1);
/// auto fwd = model.forward(x);                  // x (B, L, E)
/// auto g = model.backward(dout, fwd);           // g.params.layers[2].linear1_weight, ...
/// auto cache = model.make_cache(1);
/// Tensor<float, 3> y = model.step(prompt, cache);   // then one token at a time
/// \endcode
template <typename T>
class TransformerStack {
 public:
  /// Layer i initialised as TransformerLayer(cfg.layer, seed + i) is; the final norm to weight 1, bias 0. So stacks
  /// built from seeds s and s + 1 share layers: give several stacks seeds at least num_layers apart.
  explicit TransformerStack(const TransformerStackConfig& config, std::uint64_t seed = 0)
      : config_(config), layer_(config.layer, seed) {
    if (config_.num_layers < 1)
      detail::throw_invalid("TransformerStack", "cfg.num_layers", "expected >= 1, got " + std::to_string(config_.num_layers));
    config_.layer = layer_.config();
    params_.layers.reserve(static_cast<std::size_t>(config_.num_layers));
    params_.layers.push_back(std::move(layer_.params()));  // the stack keeps them; layer_ runs them (forward_with)
    for (Index i = 1; i < config_.num_layers; ++i)
      params_.layers.push_back(std::move(TransformerLayer<T>(config_.layer, seed + static_cast<std::uint64_t>(i)).params()));
    if (config_.final_norm) {
      params_.norm_weight = Tensor<T, 1>(std::array<Index, 1>{embed_dim()});
      params_.norm_weight.fill(T(1));
      if (has_norm_bias()) params_.norm_bias = Tensor<T, 1>(std::array<Index, 1>{embed_dim()});
    }
  }

  const TransformerStackConfig& config() const { return config_; }  ///< with the defaults filled in
  Index embed_dim() const { return config_.layer.attention.embed_dim; }  ///< E
  Index num_layers() const { return config_.num_layers; }                ///< N
  /// The parameters, writable (keep their shapes and the number of layers).
  TransformerStackParams<T>& params() { return params_; }
  /// \overload
  const TransformerStackParams<T>& params() const { return params_; }
  /// Dropout applies only in training mode; the default is false.
  void set_training(bool training) { layer_.set_training(training); }
  bool training() const { return layer_.training(); }  ///< whether dropout is on

  /// \brief The stack on x (B, L, E). A temporary Tensor x is moved into the result; a named one (and the masks of
  /// opts) stay the caller's to keep alive until backward.
  template <typename X>
  TransformerStackForward<T> forward(X&& x, const AttentionOptions<T>& opts = {}) const {
    TransformerStackForward<T> f;
    if constexpr (detail::check_module_arguments<T, X>()) {
      check_params(forward_name);
      detail::check_module_dropout(forward_name, opts, config_.layer.attention.dropout, "cfg.layer.attention.dropout",
                                   training());
      f.layers.reserve(params_.layers.size());
      AttentionOptions<T> layer_opts = opts;
      for (std::size_t i = 0; i < params_.layers.size(); ++i) {
        layer_opts.seed = detail::stack_layer_seed(opts.seed, i);
        // Layer i + 1 keeps its own copy of layer i's output as its input, so copies of `f` stay valid.
        if (i == 0)
          f.layers.push_back(layer_.forward_with(params_.layers[0], std::forward<X>(x), layer_opts));
        else
          f.layers.push_back(layer_.forward_with(params_.layers[i], Tensor<T, 3>(f.layers[i - 1].output), layer_opts));
      }
      const Tensor<T, 3>& last = f.layers.back().output;
      if (config_.final_norm) {
        f.output = detail::norm_inference<T, T>(config_.layer.norm, static_cast<T>(config_.layer.norm_eps), last.view(),
                                                params_.norm_weight, params_.norm_bias, f.final_norm);
      } else {
        f.output = last;
      }
    }
    return f;
  }

  /// \brief Gradients given dout = d loss / d output (B, L, E) of the forward `f`: the layers' backwards in reverse.
  template <typename DO>
  TransformerStackGradients<T> backward(const DO& dout, const TransformerStackForward<T>& f) const {
    TransformerStackGradients<T> g;
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
        TransformerLayerGradients<T> layer = layer_.backward_with(params_.layers[i], dy, f.layers[i]);
        g.params.layers[i] = std::move(layer.params);
        dy = std::move(layer.d_input);
      }
      g.d_input = std::move(dy);
    }
    return g;
  }

  /// \brief Caches for incremental decoding of `batch` sequences, one per layer, each with `policy`; `S` the
  /// storage type of keys and values (`model.make_cache<bfloat16>(1)`: half the memory, docs/half_precision.md).
  template <typename S = T>
  TransformerStackCache<T, S> make_cache(Index batch, const CachePolicy& policy = {}) const {
    TransformerStackCache<T, S> cache;
    for (Index i = 0; i < config_.num_layers; ++i) cache.layers.push_back(layer_.template make_cache<S>(batch, policy));
    return cache;
  }

  /// \brief Incremental decoding through every layer: x_new (B, Lnew, E) -> (B, Lnew, E), each layer's keys and
  /// values appended to its cache (TransformerLayer::step). Feeding a sequence in pieces gives the rows of one
  /// forward with Causal::top_left. If step throws on its arguments the caches are unchanged; a keep-all cache is
  /// also rolled back when a later layer runs out of memory.
  template <typename X, typename S>
  Tensor<detail::activation_of<T, X>, 3> step(const X& x_new, TransformerStackCache<T, S>& cache,
                                              const AttentionOptions<T>& opts = {},
                                              const std::vector<Index>& new_tokens = {}) const {
    return step_with(params_, x_new, cache, opts, new_tokens);
  }

  /// \brief step(x_new, cache, opts, new_tokens) with `parameters` in place of params(): of T, or 16-bit (P =
  /// bfloat16 or float16, the stack float) for inference with every weight read in 16 bits
  /// (TransformerLayer::step_with's 16-bit overload; the final norm's weights widened).
  ///
  /// `parameters` must have the shapes of params() (checked, naming `params().<name>`). With 16-bit parameters the
  /// output is bitwise that of float parameters holding the same values, for prompts (the weights widened once) and
  /// decode steps (read in place) alike. docs/half_precision.md.
  /// \code
  /// const TransformerStackParams<bfloat16> weights = params_cast<bfloat16>(model.params());   // half the bytes
  /// auto cache = model.make_cache<bfloat16>(1);
  /// Tensor<float, 3> y = model.step_with(weights, prompt, cache);
  /// y = model.step_with(weights, next_token, cache);
  /// \endcode
  template <typename P, typename X, typename S>
  Tensor<detail::activation_of<T, X>, 3> step_with(const TransformerStackParams<P>& parameters, const X& x_new,
                                                   TransformerStackCache<T, S>& cache,
                                                   const AttentionOptions<T>& opts = {},
                                                   const std::vector<Index>& new_tokens = {}) const {
    static_assert(std::is_same_v<P, T> || (std::is_same_v<T, float> && is_half_width_v<P>),
                  "TransformerStack: parameters of the stack's type, or 16-bit ones in a float stack");
    if constexpr (!detail::check_inference_arguments<T, X>()) {
      return {};
    } else if constexpr (!std::is_same_v<detail::activation_of<T, X>, T>) {
      // 16-bit activations: widened exactly, every layer and the final norm in T, the output rounded once.
      const Tensor<T, 3> wide = tensor_cast<T>(x_new);
      return tensor_cast<detail::activation_of<T, X>>(step_with(parameters, wide, cache, opts, new_tokens));
    } else {
      Tensor<T, 3> y;
      const TensorView<const T, 3> x = detail::const_view(x_new);
      check_params(step_name, parameters);
      detail::check_stack_cache(step_name, config_.num_layers, embed_dim(), x, cache);
      detail::check_step_options(step_name, opts);
      detail::step_every_layer(cache, [&](std::size_t i) {
        y = i == 0 ? layer_.step_with(parameters.layers[0], x, cache.layers[0], opts, new_tokens)
                   : layer_.step_with(parameters.layers[i], y, cache.layers[i], opts, new_tokens);
      });
      if (config_.final_norm) {
        detail::NormStatistics<T> stats;
        y = detail::norm_inference<T, P>(config_.layer.norm, static_cast<T>(config_.layer.norm_eps), y.view(),
                                         parameters.norm_weight, parameters.norm_bias, stats);
      }
      return y;
    }
  }

  /// \brief Verifies a tree of drafts in one step through every layer (MultiHeadAttention::step_tree,
  /// docs/decoding.md): x_draft (B, k, E) with k = tree.size() -> (B, k, E), every draft's row equal to steps along
  /// the path to it. Keep the accepted path with cache.keep_draft_path afterwards. Throws as step and step_tree
  /// (the tree, an evicting cache and ALiBi checked before any layer steps); the caches are unchanged then.
  /// \code
  /// const Index start = cache.length();
  /// Tensor<float, 3> y = model.step_tree(drafts, cache, tree);   // one pass over the cache for every draft
  /// cache.keep_draft_path(0, start, tree.path_to(accepted));
  /// \endcode
  template <typename X, typename S>
  Tensor<T, 3> step_tree(const X& x_draft, TransformerStackCache<T, S>& cache, const DraftTree& tree) const {
    static_assert(std::is_same_v<detail::activation_of<T, X>, T>, "TransformerStack::step_tree: x_draft of T");
    const char* fn = "TransformerStack::step_tree";
    const TensorView<const T, 3> x = detail::const_view(x_draft);
    check_params(fn, params_);
    detail::check_stack_cache(fn, config_.num_layers, embed_dim(), x, cache);
    tree.check(fn);
    detail::check_shape<3>(fn, "x_draft", x.shape(), {x.dim(0), tree.size(), embed_dim()});
    if (cache.layers.front().policy().evicts())
      detail::throw_invalid(fn, "cache", "a cache that evicts tokens cannot keep a draft path afterwards");
    if (config_.layer.attention.alibi)
      detail::throw_invalid(fn, "cfg.layer.attention.alibi",
                            "ALiBi measures distances between cache slots, not depths in a tree");
    Tensor<T, 3> y;
    detail::step_every_layer(cache, [&](std::size_t i) {
      y = i == 0 ? layer_.step_tree_with(params_.layers[0], x, cache.layers[0], tree)
                 : layer_.step_tree_with(params_.layers[i], y, cache.layers[i], tree);
    });
    if (config_.final_norm) {
      detail::NormStatistics<T> stats;
      y = detail::norm_inference<T, T>(config_.layer.norm, static_cast<T>(config_.layer.norm_eps), y.view(),
                                       params_.norm_weight, params_.norm_bias, stats);
    }
    return y;
  }

 private:
  static constexpr const char* forward_name = "TransformerStack::forward";
  static constexpr const char* backward_name = "TransformerStack::backward";
  static constexpr const char* step_name = "TransformerStack::step";

  bool has_norm_bias() const { return config_.layer.bias && config_.layer.norm == NormKind::layer_norm; }
  detail::SublayerNorm<T> final_norm() const {
    return {config_.layer.norm, static_cast<T>(config_.layer.norm_eps), false, has_norm_bias()};
  }

  void check_params(const char* function) const { check_params(function, params_); }

  /// The stack's own shapes (each layer's parameters are checked by the layer as it runs them).
  template <typename P>
  void check_params(const char* function, const TransformerStackParams<P>& parameters) const {
    if (static_cast<Index>(parameters.layers.size()) != config_.num_layers)
      detail::throw_invalid(function, "params().layers",
                            "expected " + std::to_string(config_.num_layers) + " layers, got " +
                                std::to_string(parameters.layers.size()));
    const Index e = embed_dim();
    detail::check_norm_param(function, "params().norm_weight", parameters.norm_weight, config_.final_norm, e);
    detail::check_norm_param(function, "params().norm_bias", parameters.norm_bias, config_.final_norm && has_norm_bias(),
                             e);
  }

  TransformerStackConfig config_;
  TransformerLayer<T> layer_;  // runs every layer's parameters; its own params() are empty
  TransformerStackParams<T> params_;
};

}  // namespace selfattn
