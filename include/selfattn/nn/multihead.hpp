/// \file
/// The MultiHeadAttention module: PyTorch's nn.MultiheadAttention (batch_first) plus grouped-query heads, RoPE, ALiBi,
/// a KV-cache step and inference into caller-owned buffers. Its vocabulary (configuration, parameters, results) is in
/// nn/multihead_types.hpp, the checks of its entries in nn/multihead_checks.hpp.
///
/// Dimension letters: B batch, Lq query length, Lk key length, E embed dim, H query heads, Hkv key/value
/// heads, Dh = E / H head dim.
///
/// The data walks: project (one GEMM for Q|K|V in self-attention) -> split_heads (views) -> RoPE on q, k
/// -> scaled dot-product attention, written in the merged (B, L, E) layout -> output projection.
#pragma once

#include <selfattn/attention.hpp>
#include <selfattn/errors.hpp>
#include <selfattn/half_precision.hpp>
#include <selfattn/heads.hpp>
#include <selfattn/nn/draft_tree_step.hpp>
#include <selfattn/nn/kv_cache.hpp>
#include <selfattn/nn/module_input.hpp>
#include <selfattn/nn/module_workspace.hpp>
#include <selfattn/nn/multihead_checks.hpp>
#include <selfattn/nn/multihead_projections.hpp>
#include <selfattn/nn/multihead_types.hpp>
#include <selfattn/nn/paged_step.hpp>
#include <selfattn/nn/widened_activations.hpp>
#include <selfattn/options.hpp>
#include <selfattn/positional.hpp>
#include <selfattn/projection.hpp>
#include <selfattn/tensor.hpp>

#include <algorithm>
#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

namespace selfattn {

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
      : config_(detail::normalized_config(config)), head_dim_(config_.embed_dim / config_.num_heads) {
    if (config_.rope_dim > 0)
      rope_.emplace(config_.rope_dim, static_cast<T>(config_.rope_base), config_.rope_style);
    if (config_.alibi) alibi_ = alibi_slopes<T>(config_.num_heads);
    params_ = detail::pytorch_initial_params<T>(config_, seed);
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
    return forward_with(params_, std::forward<Q>(query), std::forward<K>(key), std::forward<V>(value), opts);
  }

  /// forward(query, key, value, opts) with `parameters` in place of params() (see forward_with(parameters, x)).
  template <typename Q, typename K, typename V>
  MhaForward<T> forward_with(const MhaParams<T>& parameters, Q&& query, K&& key, V&& value,
                             const AttentionOptions<T>& opts = {}) const {
    if constexpr (detail::check_module_arguments<T, Q, K, V>()) {
      detail::SavedInput<T> q = detail::save_input<T>(std::forward<Q>(query));
      detail::SavedInput<T> k = detail::save_input<T>(std::forward<K>(key));
      detail::SavedInput<T> v = detail::save_input<T>(std::forward<V>(value));
      MhaForward<T> f = forward_walk(parameters, q.view, k.view, v.view, opts);
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
    return forward_with(params_, std::forward<X>(x), opts);
  }

  /// \brief A key/value cache for incremental decoding of `batch` sequences with this module (see step).
  ///
  /// Shapes: the cache holds keys and values of (batch, Hkv, capacity, Dh).
  /// \code
  /// auto cache = mha.make_cache(1, CachePolicy::sliding_window(256));   // KVCache<float>
  /// auto half = mha.make_cache<bfloat16>(1);   // KVCache<float, bfloat16>: keys and values in 16 bits
  /// \endcode
  /// `S` is the storage type of keys and values: T (default), or bfloat16 / float16 for a float module (half the
  /// memory; each decode step reads half the bytes; see docs/half_precision.md for what is rounded where), or
  /// std::int8_t with a bfloat16 scale per block of 32 (17/64 of float's bytes; docs/int8_cache.md).
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
    return step_with(params_, x_new, cache, opts, new_tokens);
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
    step_into_with(params_, x_new, cache, output, opts, new_tokens);
  }

  /// \brief Verifies a tree of k drafts in one step (speculative decoding, docs/decoding.md): x_draft (B, k, E),
  /// k = tree.size(), appended after each sequence's cached tokens -> (B, k, E). Draft i attends to the cached
  /// tokens, its ancestors and itself, at position positions()[b] + its depth (RoPE): its row equals one-token steps
  /// along the path to it. Keep the accepted drafts with `cache.keep_draft_path(b, start, tree.path_to(last))`
  /// before the next step. Throws std::invalid_argument naming `parents` (not a tree listed parents first),
  /// `cache` (an evicting policy) or `cfg.alibi`, ShapeError naming `x_draft`, and what step throws; the cache is
  /// unchanged then.
  template <typename X, typename S>
  Tensor<T, 3> step_tree(const X& x_draft, KVCache<T, S>& cache, const DraftTree& tree) const {
    return step_tree_with(params_, x_draft, cache, tree);
  }
  /// \brief One step of many sequences of a PagedKVCache in one call (serving, docs/paged_cache.md): x_new (B, Lnew, E)
  /// holds Lnew <= 16 new tokens of each sequence `sequences[b]`, which sit at positions length + l (RoPE), are
  /// appended to their sequences and attend with Causal::bottom_right over each sequence's tokens -> (B, Lnew, E).
  ///
  /// Equals step over a KVCache holding the same tokens (a prompt fed 16 tokens at a time too). The cache must have
  /// the module's Hkv and head dim (`cache`, ShapeError). Throws ShapeError naming `x_new` (B other than
  /// sequences.size(), Lnew above 16), std::invalid_argument naming `sequences` (one not live, or listed twice),
  /// std::length_error when the pool lacks pages for the step (PagedKVCache::pages_needed); the cache is unchanged
  /// then. Allocates its buffers per call; step_into with a workspace does not.
  /// \code
  /// PagedKVCache<float> pool({/*pages=*/1024, cfg.num_kv_heads, cfg.embed_dim / cfg.num_heads});
  /// std::vector<Index> running{pool.start(), pool.start()};
  /// Tensor<float, 3> y = mha.step(tokens, pool, running);   // tokens (2, 1, E)
  /// \endcode
  template <typename S>
  Tensor<T, 3> step(const TensorView<const T, 3>& x_new, PagedKVCache<T, S>& cache,
                    const std::vector<Index>& sequences) const {
    MhaWorkspace<T> ws;
    Tensor<T, 3> output({x_new.dim(0), x_new.dim(1), config_.embed_dim});
    step_into(x_new, cache, sequences, output.view(), ws);
    return output;
  }
  /// \overload
  template <typename S>
  Tensor<T, 3> step(const Tensor<T, 3>& x_new, PagedKVCache<T, S>& cache, const std::vector<Index>& sequences) const {
    return step(x_new.view(), cache, sequences);
  }

  /// step over a PagedKVCache into a caller-owned output (B, Lnew, E), every buffer in `ws`: after a first step of a
  /// shape, steps of that shape over no more keys allocate nothing but the pages the sequences grow into. Throws
  /// like step, and ShapeError naming `output`; nothing is written then.
  template <typename S>
  void step_into(const TensorView<const T, 3>& x_new, PagedKVCache<T, S>& cache, const std::vector<Index>& sequences,
                 const TensorView<T, 3>& output, MhaWorkspace<T>& ws) const {
    const char* fn = "MultiHeadAttention::step";
    detail::check_mha_paged_step(config_, params_, x_new, cache, sequences, fn);
    detail::check_shape<3>(fn, "output", output.shape(), {x_new.dim(0), x_new.dim(1), config_.embed_dim});
    if (detail::overlaps(output, x_new))
      detail::throw_invalid(fn, "output", "overlaps x_new; write into separate memory");
    detail::paged_step_walk(config_, rope_ ? &*rope_ : nullptr, alibi_, params_, x_new, cache, sequences, output, ws);
  }

  /// step_tree with `parameters` in place of params() (a TransformerLayer's attention).
  template <typename X, typename S>
  Tensor<T, 3> step_tree_with(const MhaParams<T>& parameters, const X& x_draft, KVCache<T, S>& cache,
                              const DraftTree& tree) const {
    return detail::draft_tree_step<T, S>(config_, rope_ ? &*rope_ : nullptr, parameters, detail::const_view(x_draft),
                                         cache, tree);
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
    forward_into_with(params_, query, key, value, output, workspace, opts);
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
    return backward_with(params_, dout, f);
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
      MhaForward<T> f = forward_walk(parameters, saved.view, saved.view, saved.view, opts);
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
      return backward_walk(parameters, detail::const_view(dout), f);
    else
      return {};
  }

  /// step(x_new, cache, opts, new_tokens) with `parameters` in place of params().
  template <typename X, typename S>
  Tensor<detail::activation_of<T, X>, 3> step_with(const MhaParams<T>& parameters, const X& x_new, KVCache<T, S>& cache,
                                                   const AttentionOptions<T>& opts = {},
                                                   const std::vector<Index>& new_tokens = {}) const {
    return step_into_new_output<S, T>(parameters, x_new, cache, opts, new_tokens);
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
    return step_into_new_output<S, P>(parameters, x_new, cache, opts, new_tokens);
  }

  /// step_into(x_new, cache, output, opts, new_tokens) with `parameters` (of T, or 16-bit as for step_with) in place
  /// of params(): after the first step of a shape, no allocation.
  template <typename P, typename X, typename S>
  void step_into_with(const MhaParams<P>& parameters, const X& x_new, KVCache<T, S>& cache,
                      const TensorView<detail::activation_of<T, X>, 3>& output, const AttentionOptions<T>& opts = {},
                      const std::vector<Index>& new_tokens = {}) const {
    static_assert(std::is_same_v<P, T> || (std::is_same_v<T, float> && is_half_width_v<P>),
                  "MultiHeadAttention: parameters of the module's type, or 16-bit ones in a float module");
    if constexpr (detail::check_inference_arguments<T, X, TensorView<detail::activation_of<T, X>, 3>>()) {
      const auto x = detail::const_view(x_new);
      detail::check_mha_step_output(config_, x, cache, output, opts, step_into_name);
      checked_step<S, P>(parameters, step_into_name, x, cache, output, cache.step_workspace(), opts, new_tokens);
    }
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
    using A = detail::activation_of<T, Q>;
    if constexpr (detail::check_inference_arguments<T, Q, K, V, TensorView<A, 3>>()) {
      const std::array<TensorView<const A, 3>, 3> inputs{detail::const_view(query), detail::const_view(key),
                                                         detail::const_view(value)};
      detail::check_mha_forward_into(config_, training_, parameters, inputs[0], inputs[1], inputs[2], output, opts,
                                     forward_into_name);
      detail::run_on_activations<T>(inputs, output, workspace, [&](const auto& wide, const TensorView<T, 3>& out) {
        forward_into_walk(parameters, wide[0], wide[1], wide[2], out, workspace, opts);
      });
    }
  }

  /// \brief A fixed memory's keys and values, projected and split into heads once for attend_memory (a decoder
  /// projects an encoder's output once per source, not once per step): key (B, Lk, kdim), value (B, Lk, vdim) ->
  /// (B, Hkv, Lk, Dh) each. ShapeError naming the argument; std::invalid_argument naming cfg.rope_dim or cfg.alibi
  /// on a module with positions (a memory's keys have none relative to the rows of a step).
  /// \code
  /// MemoryKeysValues<float> memory = cross.project_memory(encoded, encoded);   // once per source
  /// Tensor<float, 3> y = cross.attend_memory(rows, memory);                    // at every step
  /// \endcode
  template <typename K, typename V>
  MemoryKeysValues<T> project_memory(const K& key, const V& value) const {
    return project_memory_with(params_, key, value);
  }

  /// \brief Inference cross-attention of query (B, Lq, E) over a memory from project_memory: forward(query, key,
  /// value, opts).output on the memory's key and value, without projecting them again. Masks in opts as forward's,
  /// Lk the memory's length; no dropout and no weights (std::invalid_argument naming opts.dropout_p or
  /// opts.need_weights otherwise), ShapeError naming `query` or `memory.keys` / `memory.values`.
  template <typename X>
  Tensor<T, 3> attend_memory(const X& query, const MemoryKeysValues<T>& memory,
                             const AttentionOptions<T>& opts = {}) const {
    return attend_memory_with(params_, query, memory, opts);
  }

  /// project_memory(key, value) with `parameters` in place of params().
  template <typename K, typename V>
  MemoryKeysValues<T> project_memory_with(const MhaParams<T>& parameters, const K& key, const V& value) const {
    if constexpr (detail::check_module_arguments<T, K, V>()) {
      const TensorView<const T, 3> k = detail::const_view(key), v = detail::const_view(value);
      detail::check_mha_project_memory(config_, parameters, k, v, project_memory_name);
      return detail::project_memory(config_, parameters, k, v);
    } else {
      return {};
    }
  }

  /// attend_memory(query, memory, opts) with `parameters` in place of params().
  template <typename X>
  Tensor<T, 3> attend_memory_with(const MhaParams<T>& parameters, const X& query, const MemoryKeysValues<T>& memory,
                                  const AttentionOptions<T>& opts = {}) const {
    if constexpr (detail::check_module_arguments<T, X>()) {
      const TensorView<const T, 3> q = detail::const_view(query);
      detail::check_mha_attend_memory(config_, parameters, q, memory, opts, attend_memory_name);
      return attend_memory_walk(parameters, q, memory, opts);
    } else {
      return {};
    }
  }

 private:
  static constexpr const char* forward_name = "MultiHeadAttention::forward";
  static constexpr const char* backward_name = "MultiHeadAttention::backward";
  static constexpr const char* forward_into_name = "MultiHeadAttention::forward_into";
  static constexpr const char* step_name = "MultiHeadAttention::step";
  static constexpr const char* step_into_name = "MultiHeadAttention::step_into";
  static constexpr const char* project_memory_name = "MultiHeadAttention::project_memory";
  static constexpr const char* attend_memory_name = "MultiHeadAttention::attend_memory";

  // --- The walks. Each entry checks its arguments once (multihead_checks.hpp), then walks; 16-bit activations walk
  // in float on widened copies (widened_activations.hpp).

  /// forward: project -> split into heads -> attend -> project the output, keeping what backward reads.
  MhaForward<T> forward_walk(const MhaParams<T>& parameters, const TensorView<const T, 3>& query,
                             const TensorView<const T, 3>& key, const TensorView<const T, 3>& value,
                             const AttentionOptions<T>& opts) const {
    detail::check_mha_forward(config_, training_, parameters, query, key, value, opts, forward_name);
    MhaForward<T> f;
    f.query = query;
    f.key = key;
    f.value = value;
    auto projected =
        std::make_shared<detail::ProjectedHeads<T>>(detail::project_heads(config_, parameters, query, key, value));
    forward_options(parameters, opts, f.options);
    const Index batch = query.dim(0), q_len = query.dim(1), heads = config_.num_heads;
    f.attention.out = Tensor<T, 4>({batch, heads, q_len, head_dim_});
    f.attention.lse = Tensor<T, 3>({batch, heads, q_len});
    if (f.options.need_weights) f.weights = Tensor<T, 4>({batch, heads, q_len, key.dim(1)});
    f.merged = Tensor<T, 3>({batch, q_len, config_.embed_dim});
    f.output = Tensor<T, 3>({batch, q_len, config_.embed_dim});
    AttentionWorkspace<T> workspace;
    detail::StackedProjection<T> unused;  // T parameters: linear_into_stored runs linear_into
    rotate(projected->q.view(), projected->k.view());
    attend_and_project(parameters, {projected->q.view(), projected->k.view(), projected->v.view()}, f.options,
                       f.attention.out.view(), f.attention.lse.view(),
                       f.weights.data() ? f.weights.view() : TensorView<T, 4>(), f.merged.view(), f.output.view(),
                       workspace, unused);
    f.heads = std::move(projected);
    return f;
  }

  /// forward_into's walk on checked float activations, every buffer in `ws`; parameters stored as P (T, or 16 bits).
  template <typename P>
  void forward_into_walk(const MhaParams<P>& parameters, const TensorView<const T, 3>& query,
                         const TensorView<const T, 3>& key, const TensorView<const T, 3>& value,
                         const TensorView<T, 3>& output, MhaWorkspace<T>& ws, const AttentionOptions<T>& opts) const {
    const Index batch = query.dim(0), q_len = query.dim(1), e = config_.embed_dim;
    forward_options(parameters, opts, ws.options);
    const std::array<TensorView<T, 3>, 3> projections =
        detail::project_into(config_, parameters, query, key, value, ws);
    const TensorView<T, 3> merged = MhaWorkspace<T>::take(ws.merged, std::array<Index, 3>{batch, q_len, e});
    const TensorView<T, 3> lse = MhaWorkspace<T>::take(ws.lse, std::array<Index, 3>{batch, config_.num_heads, q_len});
    const std::array<TensorView<T, 4>, 3> qkv{split_heads(projections[0], config_.num_heads),
                                              split_heads(projections[1], config_.num_kv_heads),
                                              split_heads(projections[2], config_.num_kv_heads)};
    rotate(qkv[0], qkv[1]);
    attend_and_project(parameters, {qkv[0], qkv[1], qkv[2]}, ws.options, split_heads(merged, config_.num_heads), lse,
                       TensorView<T, 4>(), merged, output, ws.attention, ws.output_weights);
  }

  /// step and step_with: step into a new output, with a workspace of its own for the call.
  template <typename S, typename P, typename X>
  Tensor<detail::activation_of<T, X>, 3> step_into_new_output(const MhaParams<P>& parameters, const X& x_new,
                                                              KVCache<T, S>& cache, const AttentionOptions<T>& opts,
                                                              const std::vector<Index>& new_tokens) const {
    using A = detail::activation_of<T, X>;
    if constexpr (!detail::check_inference_arguments<T, X>()) {
      return {};
    } else {
      const TensorView<const A, 3> x = detail::const_view(x_new);
      // The output's shape needs x checked first; checked_step checks everything (cheap) before any work.
      detail::check_shape<3>(step_name, "x_new", x.shape(), {cache.batch(), detail::any_extent, config_.embed_dim});
      Tensor<A, 3> output({x.dim(0), x.dim(1), config_.embed_dim});
      MhaWorkspace<T> ws;
      checked_step<S, P>(parameters, step_name, x, cache, output.view(), ws, opts, new_tokens);
      return output;
    }
  }

  /// Every check of a step, once, then its walk on the activations of A (widened when 16-bit).
  template <typename S, typename P, typename A>
  void checked_step(const MhaParams<P>& parameters, const char* function, const TensorView<const A, 3>& x,
                    KVCache<T, S>& cache, const TensorView<A, 3>& output, MhaWorkspace<T>& ws,
                    const AttentionOptions<T>& opts, const std::vector<Index>& new_tokens) const {
    detail::check_mha_step(config_, parameters, x, cache, opts, new_tokens, ws.counts, function);
    detail::run_on_activations<T>(std::array<TensorView<const A, 3>, 1>{x}, output, ws,
                                  [&](const auto& wide, const TensorView<T, 3>& out) {
                                    step_walk(parameters, wide[0], cache, opts, out, ws);
                                  });
  }

  /// The data walk of a checked step (ws.counts holds each sequence's real new rows), into `output` with every buffer
  /// in `ws`: project -> rotate at each sequence's next positions -> append to the cache -> attend over the cache's
  /// views straight into the merged heads -> output projection.
  template <typename S, typename P>
  void step_walk(const MhaParams<P>& parameters, const TensorView<const T, 3>& x, KVCache<T, S>& cache,
                 const AttentionOptions<T>& opts, const TensorView<T, 3>& output, MhaWorkspace<T>& ws) const {
    const std::vector<Index>& counts = ws.counts;
    const Index batch = x.dim(0), new_len = x.dim(1), e = config_.embed_dim;

    // Project the new tokens and rotate them: sequence b's row l at absolute position positions()[b] + l.
    const TensorView<T, 3> qkv = MhaWorkspace<T>::take(
        ws.projection, std::array<Index, 3>{batch, new_len, detail::qkv_projection_width(config_)});
    const std::array<TensorView<T, 3>, 3> projections =
        detail::project_self_into(config_, parameters, x, qkv, ws.stacked);
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
    attention_opts = opts;  // checked: dropout_p 0, need_weights false, causal none or bottom_right
    attention_opts.causal = Causal::bottom_right;
    if (config_.alibi) attention_opts.alibi_slopes = alibi_;
    detail::add_module_logits(config_, parameters, attention_opts);
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
          cache.append(b, detail::rows_of(k, b, l0, rows)[0], detail::rows_of(v, b, l0, rows)[0],
                       rope_ ? &*rope_ : nullptr);
          const Index keys = cache.lengths()[static_cast<std::size_t>(b)];
          // The options were checked against every sequence's keys (check_mha_step): this sequence's slice of them
          // goes to the kernels as it is.
          detail::options_for_sequence(attention_opts, b, l0, rows, keys, ws.sequence_options);
          const TensorView<const T, 4> q_rows = detail::rows_of(q, b, l0, rows);
          const auto params = detail::make_stored_params<T, S>(q_rows, cache.sequence_keys(b), cache.sequence_values(b),
                                                               ws.sequence_options);
          detail::run_forward_stored(detail::over_cached(params, cache, b, 0, keys), ws.sequence_options,
                                     detail::ForwardOutputs<T>{detail::rows_of(attention, b, l0, rows),
                                                               detail::rows_of(lse, b, l0, rows), TensorView<T, 4>()},
                                     ws.attention);
        }
    } catch (...) {  // out of memory mid-step: a keep-all cache goes back to where it was
      if (!evicting)
        for (Index b = 0; b < batch; ++b) cache.truncate(b, ws.lengths_before[static_cast<std::size_t>(b)]);
      throw;
    }
    detail::linear_into_stored<T, P>(merged, parameters.out_weight.view(), parameters.out_bias.view(), output,
                                     ws.output_weights);
  }

  /// attend_memory: project the query -> attend over the memory's heads straight into the merged layout -> project
  /// the output. The options go to the kernel as they are (checked: no dropout, no ALiBi).
  Tensor<T, 3> attend_memory_walk(const MhaParams<T>& parameters, const TensorView<const T, 3>& query,
                                  const MemoryKeysValues<T>& memory, const AttentionOptions<T>& opts) const {
    const Index batch = query.dim(0), q_len = query.dim(1), e = config_.embed_dim;
    Tensor<T, 4> q = detail::contiguous_heads(
        detail::project_rows(query, parameters.q_weight, parameters.q_bias).view(), config_.num_heads);
    Tensor<T, 3> merged({batch, q_len, e}), output({batch, q_len, e}), lse({batch, config_.num_heads, q_len});
    AttentionWorkspace<T> workspace;
    detail::StackedProjection<T> unused;  // T parameters
    AttentionOptions<T> attention_opts = opts;
    detail::add_module_logits(config_, parameters, attention_opts);
    attend_and_project(parameters, {q.view(), memory.keys.view(), memory.values.view()}, attention_opts,
                       split_heads(merged.view(), config_.num_heads), lse.view(), TensorView<T, 4>(), merged.view(),
                       output.view(), workspace, unused);
    return output;
  }

  /// backward: the forward's walk in reverse.
  MhaGradients<T> backward_walk(const MhaParams<T>& parameters, const TensorView<const T, 3>& dy,
                                const MhaForward<T>& f) const {
    if (!f.heads) detail::throw_invalid(backward_name, "fwd", "is not the result of a forward call");
    detail::check_shape<3>(backward_name, "dout", dy.shape(), f.output.shape());
    detail::check_mha_params(config_, parameters, backward_name);
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
    if (config_.sinks) g.params.sinks = std::move(heads.dsinks);  // f.options held params().sinks
    return g;
  }

  /// The options the module's forward attends with: opts, the module's dropout rate (training mode only), its ALiBi
  /// slopes, soft-cap and sinks, assigned into `into` (whose vectors keep their capacity).
  template <typename P>
  void forward_options(const MhaParams<P>& parameters, const AttentionOptions<T>& opts,
                       AttentionOptions<T>& into) const {
    into = opts;
    into.dropout_p = training_ ? static_cast<T>(config_.dropout) : T(0);
    if (config_.alibi) into.alibi_slopes = alibi_;
    detail::add_module_logits(config_, parameters, into);
  }

  /// RoPE on q and k in place, at the positions of the masks (bottom-right: key row j at j, query row l at
  /// l + Lk - Lq).
  void rotate(const TensorView<T, 4>& q, const TensorView<T, 4>& k) const {
    if (rope_) {
      rope_->apply(q, k.dim(2) - q.dim(2));
      rope_->apply(k, 0);
    }
  }

  /// The walk after the projections (and RoPE), shared by forward, forward_into and attend_memory: given q, k, v
  /// split into heads, attend into `heads` (and `weights` when asked for), merge into `merged` (nothing to copy when
  /// heads is its split view), and project the output.
  /// Parameters stored as P: T, or 16 bits (the output projection's widened weights then go into `output_weights`).
  template <typename P>
  void attend_and_project(const MhaParams<P>& parameters, const std::array<TensorView<const T, 4>, 3>& qkv,
                          const AttentionOptions<T>& attention_opts, const TensorView<T, 4>& heads,
                          const TensorView<T, 3>& lse, const TensorView<T, 4>& weights, const TensorView<T, 3>& merged,
                          const TensorView<T, 3>& output, AttentionWorkspace<T>& workspace,
                          detail::StackedProjection<T>& output_weights) const {
    const auto& [q, k, v] = qkv;
    detail::run_forward(detail::make_params<T>(q, k, v, attention_opts), attention_opts,
                        detail::ForwardOutputs<T>{heads, lse, weights}, workspace);
    const TensorView<T, 4> target = split_heads(merged, config_.num_heads);
    if (target.data() != heads.data() || target.strides() != heads.strides())
      for (Index b = 0; b < heads.dim(0); ++b)
        for (Index h = 0; h < heads.dim(1); ++h) as_matrix(target[b][h]) = as_matrix(heads[b][h]);
    detail::linear_into_stored<T, P>(merged, parameters.out_weight.view(), parameters.out_bias.view(), output,
                                     output_weights);
  }

  MultiHeadAttentionConfig config_;
  Index head_dim_;
  MhaParams<T> params_;
  std::optional<RotaryEmbedding<T>> rope_;
  std::vector<T> alibi_;
  bool training_ = false;
};

}  // namespace selfattn
