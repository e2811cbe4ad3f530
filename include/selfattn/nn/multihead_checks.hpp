/// \file
/// The run-time checks of MultiHeadAttention: its configuration, its parameters' shapes, and the arguments of each
/// entry (forward, forward_into, step, step_into), each run once per call before any work, so that a failing call has
/// no effect. Each throws selfattn::ShapeError or std::invalid_argument naming the entry and the argument.
#pragma once

#include <selfattn/attention.hpp>
#include <selfattn/errors.hpp>
#include <selfattn/nn/kv_cache.hpp>
#include <selfattn/nn/module_options.hpp>
#include <selfattn/nn/multihead_types.hpp>
#include <selfattn/options.hpp>
#include <selfattn/tensor.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

namespace selfattn::detail {

/// The configuration with its defaults filled in (num_kv_heads, kdim and vdim never 0); throws
/// std::invalid_argument naming the field when it is invalid.
inline MultiHeadAttentionConfig normalized_config(MultiHeadAttentionConfig c) {
  const char* fn = "MultiHeadAttention";
  if (c.embed_dim < 1) throw_invalid(fn, "cfg.embed_dim", "expected >= 1, got " + std::to_string(c.embed_dim));
  if (c.num_heads < 1 || c.embed_dim % c.num_heads != 0)
    throw_invalid(fn, "cfg.num_heads",
                  "expected a divisor of embed_dim = " + std::to_string(c.embed_dim) + ", got " +
                      std::to_string(c.num_heads));
  if (c.num_kv_heads == 0) c.num_kv_heads = c.num_heads;
  if (c.num_kv_heads < 1 || c.num_heads % c.num_kv_heads != 0)
    throw_invalid(fn, "cfg.num_kv_heads",
                  "expected 0 or a divisor of num_heads = " + std::to_string(c.num_heads) + ", got " +
                      std::to_string(c.num_kv_heads));
  if (c.kdim < 0) throw_invalid(fn, "cfg.kdim", "expected >= 0, got " + std::to_string(c.kdim));
  if (c.vdim < 0) throw_invalid(fn, "cfg.vdim", "expected >= 0, got " + std::to_string(c.vdim));
  if (c.kdim == 0) c.kdim = c.embed_dim;
  if (c.vdim == 0) c.vdim = c.embed_dim;
  if (!(c.dropout >= 0.0 && c.dropout < 1.0))
    throw_invalid(fn, "cfg.dropout", "expected a value in [0, 1), got " + std::to_string(c.dropout));
  const Index head_dim = c.embed_dim / c.num_heads;
  if (c.rope_dim < 0 || c.rope_dim % 2 != 0 || c.rope_dim > head_dim)
    throw_invalid(fn, "cfg.rope_dim",
                  "expected an even value in [0, head_dim = " + std::to_string(head_dim) + "], got " +
                      std::to_string(c.rope_dim));
  if (!(c.rope_base > 0.0 && std::isfinite(c.rope_base)))
    throw_invalid(fn, "cfg.rope_base", "expected a finite value > 0, got " + std::to_string(c.rope_base));
  if (!(c.softcap >= 0.0 && std::isfinite(c.softcap)))
    throw_invalid(fn, "cfg.softcap", "expected a finite value >= 0 (0 = off), got " + std::to_string(c.softcap));
  return c;
}

/// params() is writable, and the _with entries take parameters held elsewhere: their shapes must be the configured
/// ones. P: the parameters' element type (the module's, or 16 bits).
template <typename P>
void check_mha_params(const MultiHeadAttentionConfig& config, const MhaParams<P>& parameters, const char* function) {
  const Index e = config.embed_dim, kv = config.num_kv_heads * (e / config.num_heads);
  check_shape<2>(function, "params().q_weight", parameters.q_weight.shape(), {e, e});
  check_shape<2>(function, "params().k_weight", parameters.k_weight.shape(), {kv, config.kdim});
  check_shape<2>(function, "params().v_weight", parameters.v_weight.shape(), {kv, config.vdim});
  check_shape<2>(function, "params().out_weight", parameters.out_weight.shape(), {e, e});
  const std::array<Index, 1> no_bias{0};
  const auto check_bias = [&](const char* name, const Tensor<P, 1>& b, Index n) {
    check_shape<1>(function, name, b.shape(), config.bias ? std::array<Index, 1>{n} : no_bias);
  };
  check_bias("params().q_bias", parameters.q_bias, e);
  check_bias("params().k_bias", parameters.k_bias, kv);
  check_bias("params().v_bias", parameters.v_bias, kv);
  check_bias("params().out_bias", parameters.out_bias, e);
  check_shape<1>(function, "params().sinks", parameters.sinks.shape(),
                 std::array<Index, 1>{config.sinks ? config.num_heads : 0});
}

/// ALiBi, the soft-cap and the sinks come from the configuration or from the options, never both (ALiBi would be
/// added twice; a cap or a sink set twice would leave one of them ignored).
template <typename T>
void check_mha_alibi(const MultiHeadAttentionConfig& config, const AttentionOptions<T>& opts, const char* function) {
  if (config.alibi && !opts.alibi_slopes.empty())
    throw_invalid(function, "opts.alibi_slopes", "must be empty when cfg.alibi is set (ALiBi added twice)");
  if (config.softcap != 0.0 && opts.softcap != T(0))
    throw_invalid(function, "opts.softcap", "must be 0 when cfg.softcap is set (the module caps its scores)");
  if (config.sinks && !opts.sinks.empty())
    throw_invalid(function, "opts.sinks",
                  "must be empty when cfg.sinks is set (the module's sinks are params().sinks)");
}

/// The module's own terms of the scores, added to a call's options: cfg.softcap and the sink logits of `parameters`
/// (stored as P: T, or 16 bits), widened to T into `into.sinks`, whose capacity is kept.
template <typename T, typename P>
void add_module_logits(const MultiHeadAttentionConfig& config, const MhaParams<P>& parameters,
                       AttentionOptions<T>& into) {
  if (config.softcap != 0.0) into.softcap = static_cast<T>(config.softcap);
  if (config.sinks) {
    into.sinks.resize(static_cast<std::size_t>(parameters.sinks.size()));
    for (Index h = 0; h < parameters.sinks.size(); ++h)
      into.sinks[static_cast<std::size_t>(h)] = widen<T>(parameters.sinks.data()[h]);
  }
}

/// The checks of forward: query (B, Lq, E), key (B, Lk, kdim), value (B, Lk, vdim), the parameters and the options.
/// A: the activations' element type (the module's T, or 16 bits).
template <typename T, typename P, typename A>
void check_mha_forward(const MultiHeadAttentionConfig& config, bool training, const MhaParams<P>& parameters,
                       const TensorView<const A, 3>& query, const TensorView<const A, 3>& key,
                       const TensorView<const A, 3>& value, const AttentionOptions<T>& opts, const char* function) {
  check_shape<3>(function, "query", query.shape(), {any_extent, any_extent, config.embed_dim});
  check_shape<3>(function, "key", key.shape(), {query.dim(0), any_extent, config.kdim});
  check_shape<3>(function, "value", value.shape(), {query.dim(0), key.dim(1), config.vdim});
  check_mha_params(config, parameters, function);
  check_mha_alibi(config, opts, function);
  check_module_dropout(function, opts, config.dropout, "cfg.dropout", training);
  validate_options(function, opts, query.dim(0), config.num_heads, query.dim(1), key.dim(1));
}

/// A memory's keys carry no positions relative to the rows attending to it: project_memory and attend_memory refuse a
/// module with RoPE or ALiBi.
inline void check_mha_memory_config(const MultiHeadAttentionConfig& config, const char* function) {
  if (config.rope_dim > 0)
    throw_invalid(function, "cfg.rope_dim",
                  "expected 0 for a memory (its keys have no positions), got " + std::to_string(config.rope_dim));
  if (config.alibi) throw_invalid(function, "cfg.alibi", "expected false for a memory (its keys have no positions)");
}

/// The checks of project_memory: key (B, Lk, kdim), value (B, Lk, vdim), the parameters, a module without positions.
template <typename T>
void check_mha_project_memory(const MultiHeadAttentionConfig& config, const MhaParams<T>& parameters,
                              const TensorView<const T, 3>& key, const TensorView<const T, 3>& value,
                              const char* function) {
  check_mha_memory_config(config, function);
  check_shape<3>(function, "key", key.shape(), {any_extent, any_extent, config.kdim});
  check_shape<3>(function, "value", value.shape(), {key.dim(0), key.dim(1), config.vdim});
  check_mha_params(config, parameters, function);
}

/// The checks of attend_memory: query (B, Lq, E), a memory projected for this module's heads, keys and values
/// (B, Hkv, Lk, Dh), the parameters, and options without dropout or weights (inference).
template <typename T>
void check_mha_attend_memory(const MultiHeadAttentionConfig& config, const MhaParams<T>& parameters,
                             const TensorView<const T, 3>& query, const MemoryKeysValues<T>& memory,
                             const AttentionOptions<T>& opts, const char* function) {
  check_mha_memory_config(config, function);
  check_shape<3>(function, "query", query.shape(), {any_extent, any_extent, config.embed_dim});
  check_shape<4>(function, "memory.keys", memory.keys.shape(),
                 {query.dim(0), config.num_kv_heads, any_extent, config.embed_dim / config.num_heads});
  check_shape<4>(function, "memory.values", memory.values.shape(), memory.keys.shape());
  check_mha_params(config, parameters, function);
  check_mha_alibi(config, opts, function);
  if (opts.need_weights)
    throw_invalid(function, "opts.need_weights", "attend_memory returns no weights (use forward); expected false");
  if (opts.dropout_p != T(0))
    throw_invalid(function, "opts.dropout_p",
                  "attend_memory applies no dropout; expected 0, got " + std::to_string(opts.dropout_p));
  validate_options(function, opts, query.dim(0), config.num_heads, query.dim(1), memory.keys.dim(2));
}

/// The checks of forward_into: forward's, no weights asked for, and an output (B, Lq, E) overlapping neither an input,
/// a mask of opts nor itself.
template <typename T, typename P, typename A>
void check_mha_forward_into(const MultiHeadAttentionConfig& config, bool training, const MhaParams<P>& parameters,
                            const TensorView<const A, 3>& query, const TensorView<const A, 3>& key,
                            const TensorView<const A, 3>& value, const TensorView<A, 3>& output,
                            const AttentionOptions<T>& opts, const char* function) {
  check_mha_forward(config, training, parameters, query, key, value, opts, function);
  if (opts.need_weights) throw_invalid(function, "opts.need_weights", "the _into form returns no weights; use forward");
  check_shape<3>(function, "output", output.shape(), {query.dim(0), query.dim(1), config.embed_dim});
  if (overlaps_itself(output)) throw_invalid(function, "output", "overlaps itself (a stride 0 or overlapping rows)");
  const std::array<std::pair<const char*, TensorView<const A, 3>>, 3> inputs{
      {{"query", query}, {"key", key}, {"value", value}}};
  for (const auto& [name, input] : inputs)
    if (overlaps(output, input))
      throw_invalid(function, "output", std::string("overlaps ") + name + "; write into separate memory");
  if (overlaps(output, opts.bias) || overlaps(output, opts.allowed))
    throw_invalid(function, "output", "overlaps a mask of opts; write into separate memory");
}

/// The checks of step: a self-attention module, x_new (B, Lnew, E) for the cache's B sequences, a cache made for the
/// module's heads, new_tokens (empty or B counts in [0, Lnew]), the parameters, the options a step allows, and room in
/// the cache. Fills `counts` (within its capacity) with the real new rows of each sequence.
template <typename T, typename S, typename P, typename A>
void check_mha_step(const MultiHeadAttentionConfig& config, const MhaParams<P>& parameters,
                    const TensorView<const A, 3>& x, const KVCache<T, S>& cache, const AttentionOptions<T>& opts,
                    const std::vector<Index>& new_tokens, std::vector<Index>& counts, const char* function) {
  const Index head_dim = config.embed_dim / config.num_heads;
  if (config.kdim != config.embed_dim || config.vdim != config.embed_dim)
    throw_invalid(function, "cfg", "step is self-attention: kdim and vdim must equal embed_dim");
  check_shape<3>(function, "x_new", x.shape(), {cache.batch(), any_extent, config.embed_dim});
  if (cache.kv_heads() != config.num_kv_heads || cache.head_dim() != head_dim)
    throw_shape_error(function, "cache",
                      "made for " + std::to_string(cache.kv_heads()) + " key/value heads of dim " +
                          std::to_string(cache.head_dim()) + ", the module has " +
                          std::to_string(config.num_kv_heads) + " of dim " + std::to_string(head_dim));
  const Index batch = x.dim(0), new_len = x.dim(1);
  if (!new_tokens.empty() && static_cast<Index>(new_tokens.size()) != batch)
    throw_shape_error(function, "new_tokens",
                      "expected " + std::to_string(batch) + " entries (one per sequence), got " +
                          std::to_string(new_tokens.size()));
  if (new_tokens.empty())
    counts.assign(static_cast<std::size_t>(batch), new_len);
  else
    counts.assign(new_tokens.begin(), new_tokens.end());
  Index longest = 0;
  for (std::size_t b = 0; b < counts.size(); ++b) {
    if (counts[b] < 0 || counts[b] > new_len)
      throw_invalid(function, "new_tokens[" + std::to_string(b) + "]",
                    "expected a value in [0, " + std::to_string(new_len) + "], got " + std::to_string(counts[b]));
    longest = std::max(longest, cache.lengths()[b] + counts[b]);
  }
  check_mha_params(config, parameters, function);
  check_mha_alibi(config, opts, function);
  check_step_options(function, opts);
  const bool evicting = cache.policy().evicts();
  if (evicting && (opts.allowed.data() || opts.bias.data() || !opts.key_lengths.empty() || opts.window_left != -1 ||
                   opts.window_right != -1))
    throw_invalid(function, "opts",
                  "masks (allowed, bias, key_lengths, windows) are not supported with an evicting cache policy");
  validate_options(function, opts, batch, config.num_heads, new_len, evicting ? 1 : longest);
  if (!evicting && !cache.fits(longest))
    throw_invalid(function, "cache", "a fixed capacity of " + std::to_string(cache.policy().capacity) +
                                         " tokens cannot hold " + std::to_string(longest));
}

/// The checks step_into adds to step's: an output (B, Lnew, E) overlapping neither x_new, the cache, a mask of opts
/// nor itself.
template <typename T, typename S, typename A>
void check_mha_step_output(const MultiHeadAttentionConfig& config, const TensorView<const A, 3>& x,
                           const KVCache<T, S>& cache, const TensorView<A, 3>& output, const AttentionOptions<T>& opts,
                           const char* function) {
  check_shape<3>(function, "x_new", x.shape(), {cache.batch(), any_extent, config.embed_dim});
  check_shape<3>(function, "output", output.shape(), {x.dim(0), x.dim(1), config.embed_dim});
  if (overlaps_itself(output)) throw_invalid(function, "output", "overlaps itself (a stride 0 or overlapping rows)");
  if (overlaps(output, x)) throw_invalid(function, "output", "overlaps x_new; write into separate memory");
  if (overlaps(output, cache.keys()) || overlaps(output, cache.values()))
    throw_invalid(function, "output", "overlaps the cache; write into separate memory");
  if (overlaps(output, opts.bias) || overlaps(output, opts.allowed))
    throw_invalid(function, "output", "overlaps a mask of opts; write into separate memory");
}

}  // namespace selfattn::detail
