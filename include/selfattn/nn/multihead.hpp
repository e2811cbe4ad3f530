/// \file
/// MultiHeadAttentionConfig, MhaParams and the MultiHeadAttention module.
///
/// Dimension letters: B batch, Lq query length, Lk key length, E embed dim, H query heads, Hkv key/value
/// heads, Dh = E / H head dim. Parameters use PyTorch's nn.Linear layout (y = x W^T + b), so the weights
/// of an nn.MultiheadAttention load as they are.
///
/// The data walks: project (one GEMM for Q|K|V in self-attention) -> split_heads (views) -> RoPE on q, k
/// -> scaled dot-product attention -> merge_heads -> output projection.
#pragma once

#include <selfattn/attention.hpp>
#include <selfattn/errors.hpp>
#include <selfattn/half_precision.hpp>
#include <selfattn/heads.hpp>
#include <selfattn/nn/kv_cache.hpp>
#include <selfattn/nn/module_input.hpp>
#include <selfattn/nn/module_options.hpp>
#include <selfattn/nn/module_workspace.hpp>
#include <selfattn/options.hpp>
#include <selfattn/positional.hpp>
#include <selfattn/projection.hpp>
#include <selfattn/tensor.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <type_traits>
#include <utility>

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
};

/// \brief The parameters with every tensor converted to `To` (tensor_cast: to 16 bits rounded to nearest even; empty
/// biases stay empty): `params_cast<bfloat16>(mha.params())` is what MultiHeadAttention::step_with's 16-bit
/// overload reads.
template <typename To, typename T>
MhaParams<To> params_cast(const MhaParams<T>& p) {
  const auto cast = [](const auto& x) { return tensor_cast<To>(x); };
  return MhaParams<To>{cast(p.q_weight), cast(p.k_weight), cast(p.v_weight), cast(p.out_weight),
                       cast(p.q_bias),   cast(p.k_bias),   cast(p.v_bias),   cast(p.out_bias)};
}

namespace detail {

/// The forward's q (after RoPE), k (after RoPE) and v, each head contiguous: q (B, H, Lq, Dh), k and v (B, Hkv, Lk,
/// Dh). Shared so that copies of a forward result stay valid: never written after the forward.
template <typename T>
struct ProjectedHeads {
  Tensor<T, 4> q, k, v;
};

/// The compile-time rule of the module's entries: (batch, length, features) Tensors or TensorViews holding the
/// module's element type T.
template <typename T, typename... X>
constexpr bool check_module_arguments() {
  constexpr bool tensors = all_tensors<X...>;
  constexpr bool rank_3 = tensors && all_of_rank<3, X...>;
  static_assert(tensors, "MultiHeadAttention: query, key, value, x, x_new and dout must be selfattn::Tensor or "
                         "TensorView; an Eigen matrix is not one (see as_view)");
  static_assert(!tensors || rank_3,
                "MultiHeadAttention: query, key, value, x, x_new and dout must be rank 3: (batch, length, features)");
  static_assert(!rank_3 || all_hold<T, X...>,
                "MultiHeadAttention<T>: query, key, value, x, x_new and dout must hold the module's element type T");
  return rank_3 && all_hold<T, X...>;
}

/// The compile-time rule of the inference entries: the module's type T (check_module_arguments), or in a float module
/// activations that all hold one 16-bit type, widened on the way in and rounded on the way out.
template <typename T, typename X0, typename... X>
constexpr bool check_inference_arguments() {
  using A = scalar_of<X0>;
  if constexpr (is_half_width_v<A>) {
    constexpr bool rank_3 = all_tensors<X0, X...> && all_of_rank<3, X0, X...>;
    static_assert(std::is_same_v<T, float>, "MultiHeadAttention: 16-bit activations run in a float module");
    static_assert(rank_3, "MultiHeadAttention: query, key, value, x_new and output must be rank 3: (batch, length, "
                          "features)");
    static_assert(!rank_3 || all_hold<A, X...>,
                  "MultiHeadAttention: 16-bit activations: query, key, value and output all hold one 16-bit type");
    return std::is_same_v<T, float> && rank_3 && all_hold<A, X...>;
  } else {
    return check_module_arguments<T, X0, X...>();
  }
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

/// \brief Multi-head attention, PyTorch's nn.MultiheadAttention (batch_first) plus grouped-query heads,
/// RoPE and ALiBi.
///
/// Shapes: forward(query (B, Lq, E), key (B, Lk, kdim), value (B, Lk, vdim), opts) -> output (B, Lq, E);
/// step(x_new (B, Lnew, E), cache) -> (B, Lnew, E); parameters as in MhaParams.
/// forward and backward are const: one module serves many threads at once.
/// \code
/// MultiHeadAttentionConfig cfg;
/// cfg.embed_dim = 64;
/// cfg.num_heads = 8;
/// MultiHeadAttention<float> mha(cfg);
/// Tensor<float, 3> x({2, 10, 64});
/// auto fwd = mha.forward(x);   // self-attention: fwd.output (2, 10, 64)
/// \endcode
template <typename T>
class MultiHeadAttention {
  static_assert(std::is_floating_point_v<T>, "MultiHeadAttention<T>: T is float or double");

 public:
  /// Xavier-uniform projection weights as PyTorch initialises them, zero biases; `seed` picks the draw.
  /// The default seed is 0: every module built without a seed has the SAME weights (PyTorch draws a fresh
  /// initialisation per module; there is no global generator here). Give each module you build its own seed.
  explicit MultiHeadAttention(const MultiHeadAttentionConfig& config, std::uint64_t seed = 0)
      : config_(normalized(config)), head_dim_(config_.embed_dim / config_.num_heads) {
    if (config_.rope_dim > 0)
      rope_.emplace(config_.rope_dim, static_cast<T>(config_.rope_base), config_.rope_style);
    if (config_.alibi) alibi_ = alibi_slopes<T>(config_.num_heads);
    initialize(seed);
  }

  /// The configuration with its defaults filled in (num_kv_heads, kdim, vdim never 0).
  const MultiHeadAttentionConfig& config() const { return config_; }
  Index head_dim() const { return head_dim_; }  ///< Dh = E / H
  /// The parameters, writable (e.g. to load PyTorch weights); keep their shapes, and do not change them
  /// between a forward and its backward.
  MhaParams<T>& params() { return params_; }
  /// \overload
  const MhaParams<T>& params() const { return params_; }
  /// Dropout (cfg.dropout) applies only in training mode; the default is false.
  void set_training(bool training) { training_ = training; }
  bool training() const { return training_; }  ///< whether dropout is on (set_training)

  /// \brief Attention of query (B, Lq, E) over key (B, Lk, kdim) and value (B, Lk, vdim).
  ///
  /// Shapes: query (B, Lq, E), key (B, Lk, kdim), value (B, Lk, vdim) -> output (B, Lq, E), weights
  /// (B, H, Lq, Lk) when opts.need_weights. Masks in `opts` broadcast to (B, H, Lq, Lk). The dropout rate is
  /// cfg.dropout, in training mode only: `opts.dropout_p` must be 0 or cfg.dropout (another value would be
  /// ignored, so it throws). With RoPE, key row j is at position j and query row l at l + Lk - Lq. Every
  /// argument is checked first: ShapeError or std::invalid_argument (also for opts.alibi_slopes together with
  /// cfg.alibi). The result views the inputs for backward: a temporary
  /// Tensor argument is moved into the result (no copy), so `mha.backward(dout, mha.forward(load()))` is safe;
  /// named tensors and views stay the caller's to keep alive, as do the mask tensors in opts.
  /// \code
  /// MhaForward<float> fwd = mha.forward(query, memory, memory);   // cross-attention: memory (B, Lk, kdim)
  /// \endcode
  template <typename Q, typename K, typename V>
  MhaForward<T> forward(Q&& query, K&& key, V&& value, const AttentionOptions<T>& opts = {}) const {
    if constexpr (detail::check_module_arguments<T, Q, K, V>()) {
      detail::SavedInput<T> q = detail::save_input<T>(std::forward<Q>(query));
      detail::SavedInput<T> k = detail::save_input<T>(std::forward<K>(key));
      detail::SavedInput<T> v = detail::save_input<T>(std::forward<V>(value));
      MhaForward<T> f = forward_views(params_, q.view, k.view, v.view, opts);
      f.kept = {std::move(q.owned), std::move(k.owned), std::move(v.owned)};
      return f;
    } else {
      return {};
    }
  }

  /// \brief Self-attention: query = key = value = x (B, L, E).
  ///
  /// Shapes: x (B, L, E) -> output (B, L, E), weights (B, H, L, L) when opts.need_weights.
  /// \code
  /// AttentionOptions<float> opts;
  /// opts.causal = Causal::top_left;
  /// Tensor<float, 3> y = mha.forward(x, opts).output;   // (B, L, E)
  /// \endcode
  template <typename X>
  MhaForward<T> forward(X&& x, const AttentionOptions<T>& opts = {}) const {
    if constexpr (detail::check_module_arguments<T, X>()) {
      detail::SavedInput<T> saved = detail::save_input<T>(std::forward<X>(x));
      MhaForward<T> f = forward_views(params_, saved.view, saved.view, saved.view, opts);
      f.kept[0] = std::move(saved.owned);
      return f;
    } else {
      return {};
    }
  }

  /// \brief A key/value cache for incremental decoding of `batch` sequences with this module (see step).
  ///
  /// Shapes: the cache holds keys and values of (batch, Hkv, capacity, Dh).
  /// \code
  /// auto cache = mha.make_cache(1, CachePolicy::sliding_window(256));   // KVCache<float>
  /// auto half = mha.make_cache<bfloat16>(1);   // KVCache<float, bfloat16>: keys and values in 16 bits
  /// \endcode
  /// `S` is the storage type of keys and values: T (default), or bfloat16 / float16 for a float module (half the
  /// memory; each decode step reads half the bytes; see docs/half_precision.md for what is rounded where).
  template <typename S = T>
  KVCache<T, S> make_cache(Index batch, const CachePolicy& policy = {}) const {
    return KVCache<T, S>(batch, config_.num_kv_heads, head_dim_, policy);
  }

  /// \brief Incremental self-attention: appends the keys and values of x_new (B, Lnew, E) to the cache
  /// and returns the output rows (B, Lnew, E).
  ///
  /// New rows of sequence b sit at positions cache.positions()[b] + l (RoPE) and attend with
  /// Causal::bottom_right over everything cached; other masks in opts refer to the cache after the append (Lk =
  /// the longest sequence's length then). No dropout, no weights: opts.causal must be Causal::none or
  /// Causal::bottom_right, opts.dropout_p 0 and opts.need_weights false (std::invalid_argument naming the option
  /// otherwise: step would ignore it). Sequences may
  /// take different numbers of new tokens: `new_tokens[b]` (default: all Lnew) are the real rows of
  /// sequence b, the rest right padding, not cached, with zero attention output. Feeding a sequence in
  /// pieces gives the output of one forward with Causal::top_left. Under an evicting policy, masks in
  /// opts are not supported and the rows attend one at a time. If step throws, the cache is unchanged.
  ///
  /// Shapes: x_new (B, Lnew, E), cache of B sequences (make_cache(B)), new_tokens empty or B entries
  /// -> (B, Lnew, E).
  /// \code
  /// auto cache = mha.make_cache(1);
  /// Tensor<float, 3> y = mha.step(prompt, cache);   // prefill: prompt (1, L, E) -> (1, L, E)
  /// y = mha.step(next_token, cache);                // (1, 1, E): attends over the L + 1 cached tokens
  /// \endcode
  template <typename X, typename S>
  Tensor<detail::activation_of<T, X>, 3> step(const X& x_new, KVCache<T, S>& cache, const AttentionOptions<T>& opts = {},
                                              const std::vector<Index>& new_tokens = {}) const {
    return step_any<S, T>(params_, x_new, cache, opts, new_tokens);
  }

  /// \brief step into a caller-owned output, with every buffer of the step in the cache's workspace
  /// (`cache.step_workspace()`): after `cache.reserve(n)` (or a fixed capacity, or an evicting policy) and one
  /// step, further steps of the same shape allocate nothing, however long the cache grows within its capacity.
  ///
  /// Shapes: x_new (B, Lnew, E), output (B, Lnew, E), writable, any strides with a contiguous last dimension.
  /// Writes bitwise what step returns. Throws like step (naming MultiHeadAttention::step_into), ShapeError naming
  /// `output` for a wrong shape and std::invalid_argument naming `output` when it overlaps x_new, the cache, a mask
  /// of opts or itself; on error nothing is written and the cache is unchanged. A cache serves one step_into at a
  /// time (it is per-sequence state already). new_tokens, when given, is read only (no copy is kept).
  /// \code
  /// auto cache = mha.make_cache(1);
  /// cache.reserve(4096);
  /// Tensor<float, 3> token({1, 1, 512}), y({1, 1, 512});
  /// for (int t = 0; t < 4000; ++t) {
  ///   mha.step_into(token, cache, y);   // 0 allocations per step after the first
  ///   token = next_embedding(y);        // the caller's, e.g. into the same buffer
  /// }
  /// \endcode
  template <typename X, typename S>
  void step_into(const X& x_new, KVCache<T, S>& cache, const TensorView<detail::activation_of<T, X>, 3>& output,
                 const AttentionOptions<T>& opts = {}, const std::vector<Index>& new_tokens = {}) const {
    step_into_any<S, T>(params_, x_new, cache, output, opts, new_tokens);
  }

  /// \brief Inference forward into a caller-owned output with every buffer in `workspace`: after a first call of a
  /// shape, calls of that shape allocate nothing. Returns no weights and keeps nothing for backward (use forward to
  /// train: its result must own what backward reads).
  ///
  /// Shapes: query (B, Lq, E), key (B, Lk, kdim), value (B, Lk, vdim) -> output (B, Lq, E), writable, any strides
  /// with a contiguous last dimension. Writes bitwise what `forward(query, key, value, opts).output` holds (dropout
  /// too, in training mode). Throws like forward (naming MultiHeadAttention::forward_into), std::invalid_argument
  /// naming `opts.need_weights` when weights are asked for, ShapeError naming `output` for a wrong shape and
  /// std::invalid_argument naming `output` when it overlaps an input, a mask of opts or itself; nothing is
  /// written on error. Self-attention (query, key and value the same tensor) projects with one GEMM, as forward.
  /// \code
  /// MhaWorkspace<float> ws;
  /// Tensor<float, 3> y({8, 128, 512});
  /// for (const auto& x : batches) mha.forward_into(x, x, x, y, ws);
  /// \endcode
  template <typename Q, typename K, typename V>
  void forward_into(const Q& query, const K& key, const V& value, const TensorView<detail::activation_of<T, Q>, 3>& output,
                    MhaWorkspace<T>& workspace, const AttentionOptions<T>& opts = {}) const {
    forward_into_any<T>(params_, query, key, value, output, workspace, opts);
  }

  /// Gradients of a scalar loss given dout = d loss / d fwd.output (B, Lq, E). The parameters must be
  /// unchanged since the forward, and the forward's inputs that the caller owns (named tensors, views, and the mask
  /// tensors of opts) still alive; temporaries passed to forward are kept by `f` itself.
  /// The forward's walk in reverse: output projection, merge_heads, attention, RoPE, input projections.
  ///
  /// Shapes: dout (B, Lq, E), f the MhaForward of the call -> d_query (B, Lq, E), d_key (B, Lk, kdim),
  /// d_value (B, Lk, vdim), params of the shapes of params(). Throws ShapeError naming `dout` when it is not
  /// the output's shape.
  /// \code
  /// MhaForward<float> fwd = mha.forward(x, opts);
  /// Tensor<float, 3> dout(fwd.output.shape());      // d loss / d output, here zero
  /// MhaGradients<float> g = mha.backward(dout, fwd);
  /// \endcode
  template <typename DO>
  MhaGradients<T> backward(const DO& dout, const MhaForward<T>& f) const {
    if constexpr (detail::check_module_arguments<T, DO>())
      return backward_views(params_, detail::const_view(dout), f);
    else
      return {};
  }

  /// \brief forward(x, opts) (self-attention, x (B, L, E)) with `parameters` in place of params().
  ///
  /// The module's configuration (heads, RoPE, ALiBi, dropout in training mode) run with parameters held elsewhere. A
  /// TransformerLayer keeps its attention's parameters in its own TransformerLayerParams and runs them through
  /// forward_with, backward_with and step_with; anyone who keeps several parameter sets for one configuration can do
  /// the same. `parameters` must have the shapes of params() (checked, ShapeError naming `params().<name>`);
  /// backward_with must get the parameters its forward_with ran with. Otherwise each behaves exactly as forward(x),
  /// backward and step.
  /// \code
  /// MhaParams<float> other = mha.params();            // a second parameter set, e.g. an average of checkpoints
  /// MhaForward<float> fwd = mha.forward_with(other, x);
  /// MhaGradients<float> g = mha.backward_with(other, dout, fwd);
  /// \endcode
  template <typename X>
  MhaForward<T> forward_with(const MhaParams<T>& parameters, X&& x, const AttentionOptions<T>& opts = {}) const {
    if constexpr (detail::check_module_arguments<T, X>()) {
      detail::SavedInput<T> saved = detail::save_input<T>(std::forward<X>(x));
      MhaForward<T> f = forward_views(parameters, saved.view, saved.view, saved.view, opts);
      f.kept[0] = std::move(saved.owned);
      return f;
    } else {
      return {};
    }
  }

  /// backward(dout, f) with the `parameters` that forward_with ran with (see forward_with).
  template <typename DO>
  MhaGradients<T> backward_with(const MhaParams<T>& parameters, const DO& dout, const MhaForward<T>& f) const {
    if constexpr (detail::check_module_arguments<T, DO>())
      return backward_views(parameters, detail::const_view(dout), f);
    else
      return {};
  }

  /// step(x_new, cache, opts, new_tokens) with `parameters` in place of params().
  template <typename X, typename S>
  Tensor<detail::activation_of<T, X>, 3> step_with(const MhaParams<T>& parameters, const X& x_new, KVCache<T, S>& cache,
                                                   const AttentionOptions<T>& opts = {},
                                                   const std::vector<Index>& new_tokens = {}) const {
    return step_any<S, T>(parameters, x_new, cache, opts, new_tokens);
  }

  /// \brief step with 16-bit parameters (P = bfloat16 or float16, the module float): inference over a KV cache
  /// with the projection weights and biases read in 16 bits (`params_cast<bfloat16>(mha.params())` makes them).
  ///
  /// Activations, RoPE, attention and the sums of the projections are float, as in step; a decode step reads each
  /// weight once, in place, widening it in registers (half the bytes of float weights); a prompt of 16 rows or more
  /// widens the weights once and runs float GEMMs. Shapes, checks and errors as step (the parameters' shapes checked
  /// like params()'s). The output is bitwise that of step_with on float parameters holding the same values (both
  /// routes sum as the float module does). half_precision.md.
  /// \code
  /// const MhaParams<bfloat16> weights = params_cast<bfloat16>(mha.params());
  /// auto cache = mha.make_cache<bfloat16>(1);      // a 16-bit cache too: every byte a step reads is 16-bit
  /// Tensor<float, 3> y = mha.step_with(weights, prompt, cache);
  /// y = mha.step_with(weights, next_token, cache);
  /// \endcode
  template <typename P, typename X, typename S, std::enable_if_t<is_half_width_v<P>, int> = 0>
  Tensor<detail::activation_of<T, X>, 3> step_with(const MhaParams<P>& parameters, const X& x_new, KVCache<T, S>& cache,
                                                   const AttentionOptions<T>& opts = {},
                                                   const std::vector<Index>& new_tokens = {}) const {
    static_assert(std::is_same_v<T, float>, "MultiHeadAttention: 16-bit parameters run in a float module");
    return step_any<S, P>(parameters, x_new, cache, opts, new_tokens);
  }

  /// step_into(x_new, cache, output, opts, new_tokens) with `parameters` (of T, or 16-bit as for step_with) in place
  /// of params(): after the first step of a shape, no allocation.
  template <typename P, typename X, typename S>
  void step_into_with(const MhaParams<P>& parameters, const X& x_new, KVCache<T, S>& cache,
                      const TensorView<detail::activation_of<T, X>, 3>& output, const AttentionOptions<T>& opts = {},
                      const std::vector<Index>& new_tokens = {}) const {
    static_assert(std::is_same_v<P, T> || (std::is_same_v<T, float> && is_half_width_v<P>),
                  "MultiHeadAttention: parameters of the module's type, or 16-bit ones in a float module");
    step_into_any<S, P>(parameters, x_new, cache, output, opts, new_tokens);
  }

  /// \brief forward_into(query, key, value, output, workspace, opts) with `parameters` (of T, or 16-bit: P =
  /// bfloat16 or float16 in a float module) in place of params(): inference without a cache, e.g. a prompt or an
  /// encoder, with the projection weights read in 16 bits.
  ///
  /// With 16-bit parameters, fewer than 16 rows per projection read the weights in place (as step_with); more widen
  /// each weight matrix once into `workspace` and run the float GEMMs, and then the output is bitwise that of
  /// forward_into on float parameters holding the same values. Checks and errors as forward_into (the parameters'
  /// shapes named like params()'s); after a first call of a shape, no allocation.
  /// \code
  /// const MhaParams<bfloat16> weights = params_cast<bfloat16>(mha.params());
  /// MhaWorkspace<float> ws;
  /// mha.forward_into_with(weights, x, x, x, y.view(), ws);
  /// \endcode
  template <typename P, typename Q, typename K, typename V>
  void forward_into_with(const MhaParams<P>& parameters, const Q& query, const K& key, const V& value,
                         const TensorView<detail::activation_of<T, Q>, 3>& output, MhaWorkspace<T>& workspace,
                         const AttentionOptions<T>& opts = {}) const {
    static_assert(std::is_same_v<P, T> || (std::is_same_v<T, float> && is_half_width_v<P>),
                  "MultiHeadAttention: parameters of the module's type, or 16-bit ones in a float module");
    forward_into_any<P>(parameters, query, key, value, output, workspace, opts);
  }

 private:
  // The inference entries' dispatch on the activations' type A (detail::activation_of): T runs the module's walk on
  // the caller's tensors; 16 bits (in a float module) widen the inputs exactly into the workspace, run the same walk
  // into a float output there, and round it once into the caller's output. Every argument is checked first.

  template <typename S, typename P, typename X>
  Tensor<detail::activation_of<T, X>, 3> step_any(const MhaParams<P>& parameters, const X& x_new, KVCache<T, S>& cache,
                                                  const AttentionOptions<T>& opts,
                                                  const std::vector<Index>& new_tokens) const {
    using A = detail::activation_of<T, X>;
    if constexpr (!detail::check_inference_arguments<T, X>()) {
      return {};
    } else if constexpr (std::is_same_v<A, T>) {
      return step_views_with<S, P>(parameters, detail::const_view(x_new), cache, opts, new_tokens);
    } else {
      const TensorView<const A, 3> x = detail::const_view(x_new);
      detail::check_shape<3>(step_name, "x_new", x.shape(), {cache.batch(), detail::any_extent, config_.embed_dim});
      Tensor<A, 3> output({x.dim(0), x.dim(1), config_.embed_dim});
      MhaWorkspace<T> ws;
      step_widened<S, P, A>(parameters, step_name, x, cache, opts, new_tokens, output.view(), ws);
      return output;
    }
  }

  template <typename S, typename P, typename X, typename A>
  void step_into_any(const MhaParams<P>& parameters, const X& x_new, KVCache<T, S>& cache,
                     const TensorView<A, 3>& output, const AttentionOptions<T>& opts,
                     const std::vector<Index>& new_tokens) const {
    if constexpr (detail::check_inference_arguments<T, X, TensorView<A, 3>>())
      step_into_views_with<S, P, A>(parameters, detail::const_view(x_new), cache, output, opts, new_tokens);
  }

  template <typename P, typename Q, typename K, typename V, typename A>
  void forward_into_any(const MhaParams<P>& parameters, const Q& query, const K& key, const V& value,
                        const TensorView<A, 3>& output, MhaWorkspace<T>& ws, const AttentionOptions<T>& opts) const {
    if constexpr (!detail::check_inference_arguments<T, Q, K, V, TensorView<A, 3>>())
      return;
    else if constexpr (std::is_same_v<A, T>)
      forward_into_views(parameters, detail::const_view(query), detail::const_view(key), detail::const_view(value),
                         output, ws, opts);
    else
      forward_into_widened(parameters, detail::const_view(query), detail::const_view(key), detail::const_view(value),
                           output, ws, opts);
  }

  MhaGradients<T> backward_views(const MhaParams<T>& parameters, const TensorView<const T, 3>& dy, const MhaForward<T>& f) const {
    if (!f.heads) detail::throw_invalid(backward_name, "fwd", "is not the result of a forward call");
    detail::check_shape<3>(backward_name, "dout", dy.shape(), f.output.shape());
    check_params(parameters, backward_name);
    MhaGradients<T> g;

    // output = merged W_out^T + b_out
    LinearGradients<T> out = linear_backward<T>(f.merged.view(), parameters.out_weight.view(), dy, config_.bias);
    g.params.out_weight = std::move(out.dweight);
    g.params.out_bias = std::move(out.dbias);

    // merged = merge_heads(attention): its backward is a split, copied so that each head's rows are contiguous (as
    // the forward's q, k and v are) for the attention's backward kernel.
    const Tensor<T, 4> d_attention(split_heads(TensorView<const T, 3>(out.dx), config_.num_heads));
    AttentionGradients<T> heads =
        detail::sdpa_backward_views<T>(backward_name, f.heads->q.view(), f.heads->k.view(), f.heads->v.view(),
                                       f.attention.out, f.attention.lse, d_attention, f.options);
    if (rope_) {
      // q' = R q is a rotation, so dq = R^T dq' = R(-angle) dq': the inverse rotation at the same positions.
      rope_->apply_inverse(heads.dq, f.key.dim(1) - f.query.dim(1));
      rope_->apply_inverse(heads.dk, 0);
    }

    // q = query W_q^T + b_q (and likewise k, v), with the heads merged back to (B, L, heads * Dh).
    const auto project_back = [this](const TensorView<const T, 3>& x, const Tensor<T, 2>& w, const Tensor<T, 4>& d_heads,
                                      Tensor<T, 3>& dx, Tensor<T, 2>& dw, Tensor<T, 1>& db) {
      LinearGradients<T> lg = linear_backward<T>(x, w.view(), merge_heads(d_heads).view(), config_.bias);
      dx = std::move(lg.dx);
      dw = std::move(lg.dweight);
      db = std::move(lg.dbias);
    };
    project_back(f.query, parameters.q_weight, heads.dq, g.d_query, g.params.q_weight, g.params.q_bias);
    project_back(f.key, parameters.k_weight, heads.dk, g.d_key, g.params.k_weight, g.params.k_bias);
    project_back(f.value, parameters.v_weight, heads.dv, g.d_value, g.params.v_weight, g.params.v_bias);
    return g;
  }

  static constexpr const char* forward_name = "MultiHeadAttention::forward";
  static constexpr const char* backward_name = "MultiHeadAttention::backward";

  static MultiHeadAttentionConfig normalized(MultiHeadAttentionConfig c) {
    const char* fn = "MultiHeadAttention";
    if (c.embed_dim < 1) detail::throw_invalid(fn, "cfg.embed_dim", "expected >= 1, got " + std::to_string(c.embed_dim));
    if (c.num_heads < 1 || c.embed_dim % c.num_heads != 0)
      detail::throw_invalid(fn, "cfg.num_heads",
                            "expected a divisor of embed_dim = " + std::to_string(c.embed_dim) + ", got " +
                                std::to_string(c.num_heads));
    if (c.num_kv_heads == 0) c.num_kv_heads = c.num_heads;
    if (c.num_kv_heads < 1 || c.num_heads % c.num_kv_heads != 0)
      detail::throw_invalid(fn, "cfg.num_kv_heads",
                            "expected 0 or a divisor of num_heads = " + std::to_string(c.num_heads) + ", got " +
                                std::to_string(c.num_kv_heads));
    if (c.kdim < 0) detail::throw_invalid(fn, "cfg.kdim", "expected >= 0, got " + std::to_string(c.kdim));
    if (c.vdim < 0) detail::throw_invalid(fn, "cfg.vdim", "expected >= 0, got " + std::to_string(c.vdim));
    if (c.kdim == 0) c.kdim = c.embed_dim;
    if (c.vdim == 0) c.vdim = c.embed_dim;
    if (!(c.dropout >= 0.0 && c.dropout < 1.0))
      detail::throw_invalid(fn, "cfg.dropout", "expected a value in [0, 1), got " + std::to_string(c.dropout));
    const Index head_dim = c.embed_dim / c.num_heads;
    if (c.rope_dim < 0 || c.rope_dim % 2 != 0 || c.rope_dim > head_dim)
      detail::throw_invalid(fn, "cfg.rope_dim",
                            "expected an even value in [0, head_dim = " + std::to_string(head_dim) + "], got " +
                                std::to_string(c.rope_dim));
    if (!(c.rope_base > 0.0 && std::isfinite(c.rope_base)))
      detail::throw_invalid(fn, "cfg.rope_base", "expected a finite value > 0, got " + std::to_string(c.rope_base));
    return c;
  }

  // PyTorch's _reset_parameters: Xavier-uniform q/k/v weights — over the stacked (3E, E) in_proj_weight
  // when all three are (E, E), else each on its own — and an out_proj drawn as nn.Linear does,
  // U(-1/sqrt(E), 1/sqrt(E)); all biases zero.
  void initialize(std::uint64_t seed) {
    const Index e = config_.embed_dim, kv = config_.num_kv_heads * head_dim_;
    params_.q_weight = Tensor<T, 2>({e, e});
    params_.k_weight = Tensor<T, 2>({kv, config_.kdim});
    params_.v_weight = Tensor<T, 2>({kv, config_.vdim});
    params_.out_weight = Tensor<T, 2>({e, e});
    if (config_.bias) {
      params_.q_bias = Tensor<T, 1>(std::array<Index, 1>{e});
      params_.k_bias = Tensor<T, 1>(std::array<Index, 1>{kv});
      params_.v_bias = Tensor<T, 1>(std::array<Index, 1>{kv});
      params_.out_bias = Tensor<T, 1>(std::array<Index, 1>{e});
    }
    std::mt19937_64 generator(seed);
    // Our own uniform draw: std::uniform_real_distribution differs between standard libraries.
    const auto fill_uniform = [&generator](Tensor<T, 2>& w, double bound) {
      for (Index n = 0; n < w.size(); ++n)
        w.data()[n] = static_cast<T>(bound * (2.0 * static_cast<double>(generator() >> 11) * 0x1.0p-53 - 1.0));
    };
    const auto xavier = [](Index fan_in, Index fan_out) { return std::sqrt(6.0 / static_cast<double>(fan_in + fan_out)); };
    const bool stacked = config_.kdim == e && config_.vdim == e && kv == e;
    fill_uniform(params_.q_weight, stacked ? xavier(e, 3 * e) : xavier(e, e));
    fill_uniform(params_.k_weight, stacked ? xavier(e, 3 * e) : xavier(config_.kdim, kv));
    fill_uniform(params_.v_weight, stacked ? xavier(e, 3 * e) : xavier(config_.vdim, kv));
    fill_uniform(params_.out_weight, 1.0 / std::sqrt(static_cast<double>(e)));
  }

  /// Checks every argument before any work, so a failing call has no effect. A: the activations' type.
  template <typename P, typename A = T>
  void validate(const MhaParams<P>& parameters, const TensorView<const A, 3>& query, const TensorView<const A, 3>& key,
                const TensorView<const A, 3>& value, const AttentionOptions<T>& opts,
                const char* function = forward_name) const {
    detail::check_shape<3>(function, "query", query.shape(), {detail::any_extent, detail::any_extent, config_.embed_dim});
    detail::check_shape<3>(function, "key", key.shape(), {query.dim(0), detail::any_extent, config_.kdim});
    detail::check_shape<3>(function, "value", value.shape(), {query.dim(0), key.dim(1), config_.vdim});
    check_params(parameters, function);
    if (config_.alibi && !opts.alibi_slopes.empty())
      detail::throw_invalid(function, "opts.alibi_slopes", "must be empty when cfg.alibi is set (ALiBi added twice)");
    detail::check_module_dropout(function, opts, config_.dropout, "cfg.dropout", training_);
    detail::validate_options(function, opts, query.dim(0), config_.num_heads, query.dim(1), key.dim(1));
  }

  /// params() is writable: check its shapes are still the configured ones.
  template <typename P>
  void check_params(const MhaParams<P>& parameters, const char* function) const {
    const Index e = config_.embed_dim, kv = config_.num_kv_heads * head_dim_;
    detail::check_shape<2>(function, "params().q_weight", parameters.q_weight.shape(), {e, e});
    detail::check_shape<2>(function, "params().k_weight", parameters.k_weight.shape(), {kv, config_.kdim});
    detail::check_shape<2>(function, "params().v_weight", parameters.v_weight.shape(), {kv, config_.vdim});
    detail::check_shape<2>(function, "params().out_weight", parameters.out_weight.shape(), {e, e});
    const std::array<Index, 1> no_bias{0};
    const auto check_bias = [&](const char* name, const Tensor<P, 1>& b, Index n) {
      detail::check_shape<1>(function, name, b.shape(), config_.bias ? std::array<Index, 1>{n} : no_bias);
    };
    check_bias("params().q_bias", parameters.q_bias, e);
    check_bias("params().k_bias", parameters.k_bias, kv);
    check_bias("params().v_bias", parameters.v_bias, kv);
    check_bias("params().out_bias", parameters.out_bias, e);
  }

  template <typename A>
  static bool is_self_attention(const TensorView<const A, 3>& query, const TensorView<const A, 3>& key,
                                const TensorView<const A, 3>& value) {
    return query.data() == key.data() && key.data() == value.data() && query.shape() == key.shape() &&
           key.shape() == value.shape() && query.strides() == key.strides() && key.strides() == value.strides();
  }

  /// Width of the Q|K|V projection of self-attention: E + 2 Hkv Dh.
  Index projection_width() const { return config_.embed_dim + 2 * config_.num_kv_heads * head_dim_; }

  /// The self-attention projection of x into qkv (B, L, E + 2 Hkv Dh): one GEMM, or three for a few rows.
  template <typename P>
  void project_self_into(const MhaParams<P>& parameters, const TensorView<const T, 3>& x, const TensorView<T, 3>& qkv,
                         detail::StackedProjection<T>& stacked) const {
    detail::fused_qkv_projection_into<T, P>(x, {parameters.q_weight.view(), parameters.k_weight.view(), parameters.v_weight.view()},
                                         {parameters.q_bias.view(), parameters.k_bias.view(), parameters.v_bias.view()}, qkv,
                                         stacked);
  }

  /// Column blocks q, k, v of a (B, L, E + 2 Hkv Dh) projection.
  std::array<TensorView<T, 3>, 3> projection_blocks(const TensorView<T, 3>& qkv) const {
    const Index e = config_.embed_dim, kv = config_.num_kv_heads * head_dim_;
    const auto block = [&](Index column, Index width) {
      // An empty projection (B = 0 or L = 0) has no data to offset.
      return TensorView<T, 3>(qkv.empty() ? nullptr : qkv.data() + column, {qkv.dim(0), qkv.dim(1), width},
                              qkv.strides());
    };
    return {block(0, e), block(e, kv), block(e + kv, kv)};
  }

  /// The projections of query, key and value split into heads, each head copied out contiguous: one GEMM for Q|K|V
  /// when they are the same tensor, else three, then one copy per tensor. Read in place, a head's rows would sit
  /// E + 2 Hkv Dh values apart, and the attention kernels run 20 to 25 % slower on them (measured at L = 2048,
  /// E = 512, H = 8); the copy costs a few percent of the projection's GEMM.
  detail::ProjectedHeads<T> project_heads(const MhaParams<T>& parameters, const TensorView<const T, 3>& query,
                                          const TensorView<const T, 3>& key, const TensorView<const T, 3>& value) const {
    const auto heads = [](const TensorView<T, 3>& x, Index count) { return Tensor<T, 4>(split_heads(x, count)); };
    if (is_self_attention(query, key, value)) {
      Tensor<T, 3> qkv(std::array<Index, 3>{query.dim(0), query.dim(1), projection_width()});
      detail::StackedProjection<T> stacked;
      project_self_into(parameters, query, qkv.view(), stacked);
      const std::array<TensorView<T, 3>, 3> blocks = projection_blocks(qkv.view());
      return {heads(blocks[0], config_.num_heads), heads(blocks[1], config_.num_kv_heads),
              heads(blocks[2], config_.num_kv_heads)};
    }
    // linear_into_stored as forward_into's cross-attention path: a few rows through the same kernel, the same bits.
    const auto project_one = [](const TensorView<const T, 3>& x, const Tensor<T, 2>& w, const Tensor<T, 1>& b) {
      Tensor<T, 3> y(std::array<Index, 3>{x.dim(0), x.dim(1), w.dim(0)});
      detail::StackedProjection<T> unused;  // T weights: nothing to widen
      detail::linear_into_stored<T, T>(x, w.view(), b.view(), y.view(), unused);
      return y;
    };
    return {heads(project_one(query, parameters.q_weight, parameters.q_bias).view(), config_.num_heads),
            heads(project_one(key, parameters.k_weight, parameters.k_bias).view(), config_.num_kv_heads),
            heads(project_one(value, parameters.v_weight, parameters.v_bias).view(), config_.num_kv_heads)};
  }

  /// The options the module's forward attends with: opts, the module's dropout rate (training mode only) and its
  /// ALiBi slopes, assigned into `into` (whose vectors keep their capacity).
  void forward_options(const AttentionOptions<T>& opts, AttentionOptions<T>& into) const {
    into = opts;
    into.dropout_p = training_ ? static_cast<T>(config_.dropout) : T(0);
    if (config_.alibi) into.alibi_slopes = alibi_;
  }

  /// The forward's walk after the projections, shared by forward and forward_into: given q, k, v split into heads,
  /// rotate q and k in place (bottom-right positions, like the masks: key row j at j, query row l at l + Lk - Lq),
  /// attend into `heads` (and `weights` when asked for), merge into `merged` (nothing to copy when heads is its split
  /// view), and project the output.
  /// Parameters stored as P: T, or 16 bits (the output projection's widened weights then go into `output_weights`).
  template <typename P>
  void attend_and_project(const MhaParams<P>& parameters, const char* function,
                          const std::array<TensorView<T, 4>, 3>& qkv, const AttentionOptions<T>& attention_opts,
                          const TensorView<T, 4>& heads, const TensorView<T, 3>& lse, const TensorView<T, 4>& weights,
                          const TensorView<T, 3>& merged, const TensorView<T, 3>& output,
                          AttentionWorkspace<T>& workspace, detail::StackedProjection<T>& output_weights) const {
    const TensorView<T, 4>& q = qkv[0];
    const TensorView<T, 4>& k = qkv[1];
    const TensorView<T, 4>& v = qkv[2];
    if (rope_) {
      rope_->apply(q, k.dim(2) - q.dim(2));
      rope_->apply(k, 0);
    }
    detail::validate_forward<T>(function, q, k, v, attention_opts);
    detail::run_forward(detail::make_params<T>(q, k, v, attention_opts), attention_opts,
                        detail::ForwardOutputs<T>{heads, lse, weights}, workspace);
    const TensorView<T, 4> target = split_heads(merged, config_.num_heads);
    if (target.data() != heads.data() || target.strides() != heads.strides())
      for (Index b = 0; b < heads.dim(0); ++b)
        for (Index h = 0; h < heads.dim(1); ++h) as_matrix(target[b][h]) = as_matrix(heads[b][h]);
    detail::linear_into_stored<T, P>(merged, parameters.out_weight.view(), parameters.out_bias.view(), output,
                                     output_weights);
  }

  MhaForward<T> forward_views(const MhaParams<T>& parameters, const TensorView<const T, 3>& query, const TensorView<const T, 3>& key,
                              const TensorView<const T, 3>& value, const AttentionOptions<T>& opts) const {
    validate(parameters, query, key, value, opts);
    MhaForward<T> f;
    f.query = query;
    f.key = key;
    f.value = value;
    auto projected = std::make_shared<detail::ProjectedHeads<T>>(project_heads(parameters, query, key, value));
    forward_options(opts, f.options);
    const Index batch = query.dim(0), q_len = query.dim(1), heads = config_.num_heads;
    f.attention.out = Tensor<T, 4>({batch, heads, q_len, head_dim_});
    f.attention.lse = Tensor<T, 3>({batch, heads, q_len});
    if (f.options.need_weights) f.weights = Tensor<T, 4>({batch, heads, q_len, key.dim(1)});
    f.merged = Tensor<T, 3>({batch, q_len, config_.embed_dim});
    f.output = Tensor<T, 3>({batch, q_len, config_.embed_dim});
    AttentionWorkspace<T> workspace;
    detail::StackedProjection<T> unused;  // T parameters: linear_into_stored runs linear_into
    attend_and_project(parameters, forward_name, {projected->q.view(), projected->k.view(), projected->v.view()},
                       f.options, f.attention.out.view(), f.attention.lse.view(),
                       f.weights.data() ? f.weights.view() : TensorView<T, 4>(), f.merged.view(), f.output.view(),
                       workspace, unused);
    f.heads = std::move(projected);
    return f;
  }

  static constexpr const char* forward_into_name = "MultiHeadAttention::forward_into";

  /// Every check of forward_into (activations of A: T, or 16 bits), before anything is written.
  template <typename P, typename A>
  void check_forward_into(const MhaParams<P>& parameters, const TensorView<const A, 3>& query,
                          const TensorView<const A, 3>& key, const TensorView<const A, 3>& value,
                          const TensorView<A, 3>& output, const AttentionOptions<T>& opts) const {
    validate(parameters, query, key, value, opts, forward_into_name);
    if (opts.need_weights)
      detail::throw_invalid(forward_into_name, "opts.need_weights", "the _into form returns no weights; use forward");
    detail::check_shape<3>(forward_into_name, "output", output.shape(), {query.dim(0), query.dim(1), config_.embed_dim});
    if (detail::overlaps_itself(output))
      detail::throw_invalid(forward_into_name, "output", "overlaps itself (a stride 0 or overlapping rows)");
    const std::array<std::pair<const char*, TensorView<const A, 3>>, 3> inputs{
        {{"query", query}, {"key", key}, {"value", value}}};
    for (const auto& [name, input] : inputs)
      if (detail::overlaps(output, input))
        detail::throw_invalid(forward_into_name, "output", std::string("overlaps ") + name + "; write into separate memory");
    if (detail::overlaps(output, opts.bias) || detail::overlaps(output, opts.allowed))
      detail::throw_invalid(forward_into_name, "output", "overlaps a mask of opts; write into separate memory");
  }

  /// forward_into with parameters stored as P: T, or 16 bits (forward_into_with).
  template <typename P>
  void forward_into_views(const MhaParams<P>& parameters, const TensorView<const T, 3>& query, const TensorView<const T, 3>& key,
                          const TensorView<const T, 3>& value, const TensorView<T, 3>& output, MhaWorkspace<T>& ws,
                          const AttentionOptions<T>& opts) const {
    check_forward_into(parameters, query, key, value, output, opts);
    const Index batch = query.dim(0), q_len = query.dim(1), k_len = key.dim(1), e = config_.embed_dim;
    forward_options(opts, ws.options);
    std::array<TensorView<T, 3>, 3> projections;
    if (is_self_attention(query, key, value)) {
      const TensorView<T, 3> qkv = MhaWorkspace<T>::take(ws.projection, std::array<Index, 3>{batch, q_len, projection_width()});
      project_self_into(parameters, query, qkv, ws.stacked);
      projections = projection_blocks(qkv);
    } else {  // three contiguous blocks of one buffer
      const Index kv = config_.num_kv_heads * head_dim_;
      T* base = MhaWorkspace<T>::take(ws.projection, std::array<Index, 1>{batch * (q_len * e + 2 * k_len * kv)}).data();
      projections = {TensorView<T, 3>(base, {batch, q_len, e}),
                     TensorView<T, 3>(base + batch * q_len * e, {batch, k_len, kv}),
                     TensorView<T, 3>(base + batch * (q_len * e + k_len * kv), {batch, k_len, kv})};
      detail::linear_into_stored<T, P>(query, parameters.q_weight.view(), parameters.q_bias.view(), projections[0],
                                       ws.stacked);
      detail::linear_into_stored<T, P>(key, parameters.k_weight.view(), parameters.k_bias.view(), projections[1],
                                       ws.key_weights);
      detail::linear_into_stored<T, P>(value, parameters.v_weight.view(), parameters.v_bias.view(), projections[2],
                                       ws.value_weights);
    }
    const TensorView<T, 3> merged = MhaWorkspace<T>::take(ws.merged, std::array<Index, 3>{batch, q_len, e});
    const TensorView<T, 3> lse = MhaWorkspace<T>::take(ws.lse, std::array<Index, 3>{batch, config_.num_heads, q_len});
    const std::array<TensorView<T, 4>, 3> qkv{split_heads(projections[0], config_.num_heads),
                                              split_heads(projections[1], config_.num_kv_heads),
                                              split_heads(projections[2], config_.num_kv_heads)};
    attend_and_project(parameters, forward_into_name, qkv, ws.options, split_heads(merged, config_.num_heads), lse,
                       TensorView<T, 4>(), merged, output, ws.attention, ws.output_weights);
  }

  /// forward_into on 16-bit activations A: the inputs widened exactly into the workspace (once for self-attention,
  /// so that it still projects with one GEMM), the float walk into the workspace, its output rounded once.
  template <typename P, typename A>
  void forward_into_widened(const MhaParams<P>& parameters, const TensorView<const A, 3>& query,
                            const TensorView<const A, 3>& key, const TensorView<const A, 3>& value,
                            const TensorView<A, 3>& output, MhaWorkspace<T>& ws, const AttentionOptions<T>& opts) const {
    check_forward_into(parameters, query, key, value, output, opts);
    const Index q_size = query.size(), k_size = key.size();
    const bool self = is_self_attention(query, key, value);
    T* base = MhaWorkspace<T>::take(ws.widened_input, std::array<Index, 1>{self ? q_size : q_size + k_size + value.size()})
                  .data();
    const auto widen = [](const TensorView<const A, 3>& from, T* to) {
      const TensorView<T, 3> wide(to, from.shape());
      detail::convert_view<A, T, 3>(from, wide);
      return TensorView<const T, 3>(wide);
    };
    const TensorView<const T, 3> wide_query = widen(query, base);
    const TensorView<const T, 3> wide_key = self ? wide_query : widen(key, base + q_size);
    const TensorView<const T, 3> wide_value = self ? wide_query : widen(value, base + q_size + k_size);
    const TensorView<T, 3> wide_output = MhaWorkspace<T>::take(ws.widened_output, output.shape());
    forward_into_views(parameters, wide_query, wide_key, wide_value, wide_output, ws, opts);
    detail::convert_view<T, A, 3>(wide_output, output);
  }

  static constexpr const char* step_name = "MultiHeadAttention::step";

  /// A (1, heads, rows, D) view of rows [row, row + rows) of batch b of a (B, heads, L, D) view.
  template <typename U>
  static TensorView<U, 4> rows_of(const TensorView<U, 4>& x, Index b, Index row, Index rows) {
    return TensorView<U, 4>(x.data() + b * x.stride(0) + row * x.stride(2), {1, x.dim(1), rows, x.dim(3)}, x.strides());
  }
  /// A (1, heads, rows) view of rows [row, row + rows) of batch b of a (B, heads, L) view.
  template <typename U>
  static TensorView<U, 3> rows_of3(const TensorView<U, 3>& x, Index b, Index row, Index rows) {
    return TensorView<U, 3>(x.data() + b * x.stride(0) + row * x.stride(2), {1, x.dim(1), rows}, x.strides());
  }

  /// Checks every argument of step before any work; returns the real new rows of each sequence.
  /// Fills `counts` (within its capacity) with the real new rows of each sequence.
  template <typename S, typename P>
  void validate_step(const MhaParams<P>& parameters, const char* function, const TensorView<const T, 3>& x, const KVCache<T, S>& cache,
                     const AttentionOptions<T>& opts, const std::vector<Index>& new_tokens,
                     std::vector<Index>& counts) const {
    if (config_.kdim != config_.embed_dim || config_.vdim != config_.embed_dim)
      detail::throw_invalid(function, "cfg", "step is self-attention: kdim and vdim must equal embed_dim");
    detail::check_shape<3>(function, "x_new", x.shape(), {cache.batch(), detail::any_extent, config_.embed_dim});
    if (cache.kv_heads() != config_.num_kv_heads || cache.head_dim() != head_dim_)
      detail::throw_shape_error(function, "cache",
                                "made for " + std::to_string(cache.kv_heads()) + " key/value heads of dim " +
                                    std::to_string(cache.head_dim()) + ", the module has " +
                                    std::to_string(config_.num_kv_heads) + " of dim " + std::to_string(head_dim_));
    const Index batch = x.dim(0), new_len = x.dim(1);
    if (!new_tokens.empty() && static_cast<Index>(new_tokens.size()) != batch)
      detail::throw_shape_error(function, "new_tokens",
                                "expected " + std::to_string(batch) + " entries (one per sequence), got " +
                                    std::to_string(new_tokens.size()));
    if (new_tokens.empty())
      counts.assign(static_cast<std::size_t>(batch), new_len);
    else
      counts.assign(new_tokens.begin(), new_tokens.end());
    Index longest = 0;
    for (std::size_t b = 0; b < counts.size(); ++b) {
      if (counts[b] < 0 || counts[b] > new_len)
        detail::throw_invalid(function, "new_tokens[" + std::to_string(b) + "]",
                              "expected a value in [0, " + std::to_string(new_len) + "], got " + std::to_string(counts[b]));
      longest = std::max(longest, cache.lengths()[b] + counts[b]);
    }
    check_params(parameters, function);
    if (config_.alibi && !opts.alibi_slopes.empty())
      detail::throw_invalid(function, "opts.alibi_slopes", "must be empty when cfg.alibi is set (ALiBi added twice)");
    detail::check_step_options(function, opts);
    const bool evicting = cache.policy().evicts();
    if (evicting && (opts.allowed.data() || opts.bias.data() || !opts.key_lengths.empty() || opts.window_left != -1 ||
                     opts.window_right != -1))
      detail::throw_invalid(function, "opts",
                            "masks (allowed, bias, key_lengths, windows) are not supported with an evicting cache policy");
    detail::validate_options(function, opts, batch, config_.num_heads, new_len, evicting ? 1 : longest);
    if (!evicting && !cache.fits(longest))
      detail::throw_invalid(function, "cache", "a fixed capacity of " + std::to_string(cache.policy().capacity) +
                                                    " tokens cannot hold " + std::to_string(longest));
  }

  /// The data walk of step, into `output` with every buffer in `ws`: project -> rotate at each sequence's next
  /// positions -> append to the cache -> attend over the cache's views (the public sdpa path) straight into the
  /// merged heads -> output projection. step allocates ws and output for the call; step_into passes the cache's.
  template <typename S, typename P>
  void step_core(const MhaParams<P>& parameters, const char* function, const TensorView<const T, 3>& x, KVCache<T, S>& cache,
                 const AttentionOptions<T>& opts, const std::vector<Index>& new_tokens, const TensorView<T, 3>& output,
                 MhaWorkspace<T>& ws) const {
    validate_step(parameters, function, x, cache, opts, new_tokens, ws.counts);
    const std::vector<Index>& counts = ws.counts;
    const Index batch = x.dim(0), new_len = x.dim(1), e = config_.embed_dim;

    // Project the new tokens and rotate them: sequence b's row l at absolute position positions()[b] + l.
    const TensorView<T, 3> qkv = MhaWorkspace<T>::take(ws.projection, std::array<Index, 3>{batch, new_len, projection_width()});
    project_self_into(parameters, x, qkv, ws.stacked);
    const std::array<TensorView<T, 3>, 3> projections = projection_blocks(qkv);
    const TensorView<T, 4> q = split_heads(projections[0], config_.num_heads);
    const TensorView<T, 4> k = split_heads(projections[1], config_.num_kv_heads);
    const TensorView<T, 4> v = split_heads(projections[2], config_.num_kv_heads);
    if (rope_) {
      rope_->apply(q, cache.positions());
      rope_->apply(k, cache.positions());
    }

    // Append and attend, sequence by sequence, with Causal::bottom_right over everything cached. An evicting
    // cache takes one row at a time, so that every row sees exactly the sinks and the last `window` tokens.
    AttentionOptions<T>& attention_opts = ws.options;
    attention_opts = opts;  // validate_step left dropout_p 0, need_weights false, causal none or bottom_right
    attention_opts.causal = Causal::bottom_right;
    if (config_.alibi) attention_opts.alibi_slopes = alibi_;
    // The heads are written into the merged (B, Lnew, E) layout directly; padding rows stay 0.
    const TensorView<T, 3> merged = MhaWorkspace<T>::take(ws.merged, std::array<Index, 3>{batch, new_len, e});
    std::fill(merged.data(), merged.data() + merged.size(), T(0));
    const TensorView<T, 4> attention = split_heads(merged, config_.num_heads);
    const TensorView<T, 3> lse = MhaWorkspace<T>::take(ws.lse, std::array<Index, 3>{batch, config_.num_heads, new_len});
    ws.lengths_before.assign(cache.lengths().begin(), cache.lengths().end());
    const bool evicting = cache.policy().evicts();
    const Index rows_per_pass = evicting ? 1 : new_len;
    // The decode kernel's partials grow with the keys: room for the cache's capacity at once.
    ws.attention.reserve_decode(config_.num_kv_heads, (config_.num_heads / config_.num_kv_heads) * rows_per_pass,
                                cache.capacity(), head_dim_);
    try {
      for (Index l0 = 0; l0 < new_len; l0 += rows_per_pass)
        for (Index b = 0; b < batch; ++b) {
          const Index rows = std::min(rows_per_pass, counts[static_cast<std::size_t>(b)] - l0);
          if (rows <= 0) continue;
          cache.append(b, rows_of(k, b, l0, rows)[0], rows_of(v, b, l0, rows)[0], rope_ ? &*rope_ : nullptr);
          const Index keys = cache.lengths()[static_cast<std::size_t>(b)];
          detail::options_for_sequence(attention_opts, b, l0, rows, keys, ws.sequence_options);
          detail::sdpa_forward_into_views<T>(function, rows_of(q, b, l0, rows), cache.sequence_keys(b),
                                             cache.sequence_values(b), rows_of(attention, b, l0, rows),
                                             rows_of3(lse, b, l0, rows), ws.sequence_options, ws.attention);
        }
    } catch (...) {  // out of memory mid-step: a keep-all cache goes back to where it was
      if (!evicting)
        for (Index b = 0; b < batch; ++b) cache.truncate(b, ws.lengths_before[static_cast<std::size_t>(b)]);
      throw;
    }
    detail::linear_into_stored<T, P>(merged, parameters.out_weight.view(), parameters.out_bias.view(), output,
                                     ws.output_weights);
  }

  template <typename S>
  Tensor<T, 3> step_views(const MhaParams<T>& parameters, const TensorView<const T, 3>& x, KVCache<T, S>& cache, const AttentionOptions<T>& opts,
                          const std::vector<Index>& new_tokens) const {
    return step_views_with<S, T>(parameters, x, cache, opts, new_tokens);
  }

  /// step_views with parameters stored as P: T, or 16 bits (step_with's 16-bit overload).
  template <typename S, typename P>
  Tensor<T, 3> step_views_with(const MhaParams<P>& parameters, const TensorView<const T, 3>& x, KVCache<T, S>& cache,
                               const AttentionOptions<T>& opts, const std::vector<Index>& new_tokens) const {
    MhaWorkspace<T> ws;
    Tensor<T, 3> output;
    // The output's shape needs x checked first; step_core checks everything again (cheap) before any work.
    detail::check_shape<3>(step_name, "x_new", x.shape(), {cache.batch(), detail::any_extent, config_.embed_dim});
    output = Tensor<T, 3>({x.dim(0), x.dim(1), config_.embed_dim});
    step_core(parameters, step_name, x, cache, opts, new_tokens, output.view(), ws);
    return output;
  }

  static constexpr const char* step_into_name = "MultiHeadAttention::step_into";

  template <typename S>
  void step_into_views(const MhaParams<T>& parameters, const TensorView<const T, 3>& x, KVCache<T, S>& cache, const TensorView<T, 3>& output,
                       const AttentionOptions<T>& opts, const std::vector<Index>& new_tokens) const {
    step_into_views_with<S, T, T>(parameters, x, cache, output, opts, new_tokens);
  }

  /// step_into_views with parameters stored as P (T, or 16 bits) and activations as A (T, or 16 bits).
  template <typename S, typename P, typename A>
  void step_into_views_with(const MhaParams<P>& parameters, const TensorView<const A, 3>& x, KVCache<T, S>& cache,
                            const TensorView<A, 3>& output, const AttentionOptions<T>& opts,
                            const std::vector<Index>& new_tokens) const {
    detail::check_shape<3>(step_into_name, "x_new", x.shape(), {cache.batch(), detail::any_extent, config_.embed_dim});
    detail::check_shape<3>(step_into_name, "output", output.shape(), {x.dim(0), x.dim(1), config_.embed_dim});
    if (detail::overlaps_itself(output))
      detail::throw_invalid(step_into_name, "output", "overlaps itself (a stride 0 or overlapping rows)");
    if (detail::overlaps(output, x))
      detail::throw_invalid(step_into_name, "output", "overlaps x_new; write into separate memory");
    if (detail::overlaps(output, cache.keys()) || detail::overlaps(output, cache.values()))
      detail::throw_invalid(step_into_name, "output", "overlaps the cache; write into separate memory");
    if (detail::overlaps(output, opts.bias) || detail::overlaps(output, opts.allowed))
      detail::throw_invalid(step_into_name, "output", "overlaps a mask of opts; write into separate memory");
    if constexpr (std::is_same_v<A, T>)
      step_core(parameters, step_into_name, x, cache, opts, new_tokens, output, cache.step_workspace());
    else
      step_widened<S, P, A>(parameters, step_into_name, x, cache, opts, new_tokens, output, cache.step_workspace());
  }

  /// step_core on 16-bit activations A: x widened exactly into the workspace, the float step into the workspace,
  /// its output rounded once into `output` (only after the step succeeded: on error nothing is written).
  template <typename S, typename P, typename A>
  void step_widened(const MhaParams<P>& parameters, const char* function, const TensorView<const A, 3>& x,
                    KVCache<T, S>& cache, const AttentionOptions<T>& opts, const std::vector<Index>& new_tokens,
                    const TensorView<A, 3>& output, MhaWorkspace<T>& ws) const {
    const TensorView<T, 3> wide_x = MhaWorkspace<T>::take(ws.widened_input, x.shape());
    detail::convert_view<A, T, 3>(x, wide_x);
    const TensorView<T, 3> wide_output = MhaWorkspace<T>::take(ws.widened_output, output.shape());
    step_core(parameters, function, wide_x, cache, opts, new_tokens, wide_output, ws);
    detail::convert_view<T, A, 3>(wide_output, output);
  }

  MultiHeadAttentionConfig config_;
  Index head_dim_;
  MhaParams<T> params_;
  std::optional<RotaryEmbedding<T>> rope_;
  std::vector<T> alibi_;
  bool training_ = false;
};

}  // namespace selfattn
