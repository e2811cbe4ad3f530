/// \file
/// The data walk of MultiHeadAttention::step over a PagedKVCache (serving many sequences from one pool,
/// docs/paged_cache.md): the new tokens of every listed sequence projected in one GEMM, rotated at each sequence's
/// next positions, appended to their sequences, attended in one paged_attention call, and projected out. Below the
/// module (it takes the module's configuration, parameters, RoPE and ALiBi slopes), beside the step's own walk.
#pragma once

#include <selfattn/heads.hpp>
#include <selfattn/nn/module_workspace.hpp>
#include <selfattn/nn/multihead_checks.hpp>
#include <selfattn/nn/multihead_projections.hpp>
#include <selfattn/nn/multihead_types.hpp>
#include <selfattn/paged_attention.hpp>
#include <selfattn/paged_cache.hpp>
#include <selfattn/positional.hpp>
#include <selfattn/projection.hpp>
#include <selfattn/tensor.hpp>

#include <algorithm>
#include <array>
#include <stdexcept>
#include <string>
#include <vector>

namespace selfattn::detail {

/// Every check of a paged step, before anything changes: the parameters, x (B, Lnew, E) with B = sequences.size() and
/// Lnew <= 16, a cache of the module's key/value heads and head dim, distinct live sequences, and free pages for all
/// of the appends.
template <typename T, typename S>
void check_mha_paged_step(const MultiHeadAttentionConfig& config, const MhaParams<T>& parameters,
                          const TensorView<const T, 3>& x, const PagedKVCache<T, S>& cache,
                          const std::vector<Index>& sequences, const char* function) {
  check_mha_params(config, parameters, function);
  const Index batch = static_cast<Index>(sequences.size()), head_dim = config.embed_dim / config.num_heads;
  check_shape<3>(function, "x_new", x.shape(), {batch, any_extent, config.embed_dim});
  if (x.dim(1) > decode_max_query_rows)
    throw_shape_error(function, "x_new",
                      "at most " + std::to_string(decode_max_query_rows) +
                          " new tokens per sequence in a paged step (a prompt: steps of up to 16), got shape " +
                          shape_string<3>(x.shape()));
  if (cache.kv_heads() != config.num_kv_heads || cache.head_dim() != head_dim || cache.value_dim() != head_dim)
    throw_shape_error(function, "cache",
                      "expected a cache of " + std::to_string(config.num_kv_heads) + " key/value heads of dim " +
                          std::to_string(head_dim) + ", got " + std::to_string(cache.kv_heads()) + " heads, key dim " +
                          std::to_string(cache.head_dim()) + ", value dim " + std::to_string(cache.value_dim()));
  std::vector<Index> sorted = sequences;
  std::sort(sorted.begin(), sorted.end());
  for (std::size_t i = 0; i < sorted.size(); ++i) {
    if (!cache.is_live(sorted[i]))
      throw_invalid(function, "sequences", "expected live sequences of the cache, got " + std::to_string(sorted[i]));
    if (i > 0 && sorted[i] == sorted[i - 1])
      throw_invalid(function, "sequences", "lists sequence " + std::to_string(sorted[i]) + " twice");
  }
  const Index needed = cache.pages_needed(sequences, x.dim(1));
  if (needed > cache.free_pages())
    throw std::length_error(std::string(function) + ": the step needs " + std::to_string(needed) +
                            " pages, the pool has " + std::to_string(cache.free_pages()) +
                            " free (PagedKVCache::grow, or end a sequence)");
}

/// The walk of a checked paged step into `output` (B, Lnew, E), every buffer in `ws`: project -> rotate sequence b's
/// rows at positions length_b, length_b + 1, ... -> append to sequence b -> one paged_attention over all of them,
/// bottom-right causal per sequence, straight into the merged heads -> output projection. If an append throws (out of
/// memory), every sequence goes back to its length before the call.
template <typename T, typename S>
void paged_step_walk(const MultiHeadAttentionConfig& config, const RotaryEmbedding<T>* rope,
                     const std::vector<T>& alibi, const MhaParams<T>& parameters, const TensorView<const T, 3>& x,
                     PagedKVCache<T, S>& cache, const std::vector<Index>& sequences, const TensorView<T, 3>& output,
                     MhaWorkspace<T>& ws) {
  const Index batch = x.dim(0), new_len = x.dim(1);
  const TensorView<T, 3> qkv =
      MhaWorkspace<T>::take(ws.projection, std::array<Index, 3>{batch, new_len, qkv_projection_width(config)});
  const std::array<TensorView<T, 3>, 3> projections = project_self_into(config, parameters, x, qkv, ws.stacked);
  const TensorView<T, 4> q = split_heads(projections[0], config.num_heads);
  const TensorView<T, 4> k = split_heads(projections[1], config.num_kv_heads);
  const TensorView<T, 4> v = split_heads(projections[2], config.num_kv_heads);
  ws.lengths_before.clear();
  for (const Index s : sequences) ws.lengths_before.push_back(cache.length(s));
  if (rope) {
    rope->apply(q, ws.lengths_before);
    rope->apply(k, ws.lengths_before);
  }
  try {
    for (Index b = 0; b < batch; ++b)
      cache.append(sequences[static_cast<std::size_t>(b)], rows_of(k, b, 0, new_len)[0], rows_of(v, b, 0, new_len)[0]);
  } catch (...) {
    for (Index b = 0; b < batch; ++b)
      cache.truncate(sequences[static_cast<std::size_t>(b)], ws.lengths_before[static_cast<std::size_t>(b)]);
    throw;
  }
  AttentionOptions<T>& opts = ws.options;
  opts = AttentionOptions<T>();
  opts.causal = Causal::bottom_right;
  if (config.alibi) opts.alibi_slopes = alibi;
  add_module_logits(config, parameters, opts);
  const TensorView<T, 3> merged =
      MhaWorkspace<T>::take(ws.merged, std::array<Index, 3>{batch, new_len, config.embed_dim});
  const TensorView<T, 3> lse = MhaWorkspace<T>::take(ws.lse, std::array<Index, 3>{batch, config.num_heads, new_len});
  paged_attention_into(TensorView<const T, 4>(q), cache, sequences, split_heads(merged, config.num_heads), lse,
                       ws.attention, opts);
  linear_into_stored<T, T>(merged, parameters.out_weight.view(), parameters.out_bias.view(), output, ws.output_weights);
}

}  // namespace selfattn::detail
