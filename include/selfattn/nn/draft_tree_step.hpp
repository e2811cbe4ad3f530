#pragma once
/// \file
/// The data walk of MultiHeadAttention::step_tree (speculative decoding, docs/decoding.md): a tree of drafts
/// projected, rotated at their depths, appended to the cache, attended over the cached tokens and over each other,
/// and projected out. Below the module (it takes the module's configuration, parameters and RoPE), beside the
/// step's own walk.

#include <selfattn/attention.hpp>
#include <selfattn/heads.hpp>
#include <selfattn/merge.hpp>
#include <selfattn/nn/draft_tree.hpp>
#include <selfattn/nn/kv_cache.hpp>
#include <selfattn/nn/module_workspace.hpp>
#include <selfattn/nn/multihead_checks.hpp>
#include <selfattn/nn/multihead_projections.hpp>
#include <selfattn/nn/multihead_types.hpp>
#include <selfattn/positional.hpp>
#include <selfattn/projection.hpp>
#include <selfattn/tensor.hpp>

#include <algorithm>
#include <array>
#include <type_traits>
#include <vector>

namespace selfattn::detail {

/// step_tree's checks, every one before anything changes: the tree, x_draft (B, k, E), no ALiBi (its distances are
/// between cache slots, not depths in a tree), a cache that keeps every token (the path is kept afterwards), and
/// everything a step checks.
template <typename T, typename S>
void check_mha_step_tree(const MultiHeadAttentionConfig& config, const MhaParams<T>& parameters,
                         const TensorView<const T, 3>& x, const KVCache<T, S>& cache, const DraftTree& tree,
                         std::vector<Index>& counts, const char* function) {
  tree.check(function);
  check_shape<3>(function, "x_draft", x.shape(), {cache.batch(), tree.size(), config.embed_dim});
  if (config.alibi)
    throw_invalid(function, "cfg.alibi", "ALiBi measures distances between cache slots, not depths in a tree");
  if (cache.policy().evicts())
    throw_invalid(function, "cache", "a cache that evicts tokens cannot keep a draft path afterwards");
  check_mha_step(config, parameters, x, cache, AttentionOptions<T>(), {}, counts, function);
}

/// Attends the k drafts of sequence b (q_rows (1, H, k, Dh), appended at slot `prefix`) over the cached tokens with
/// no mask (the decode kernel's fast paths, one pass over the cache) and over each other under the tree's (1, 1, k,
/// k) mask, merges the two by their log-sum-exps (merge_attention_partials' rule) into sequence b of `heads`.
/// `logits` holds the module's soft-cap, on both parts, and its sinks, on the drafts' part only: a sink is one more
/// key without a value, which the merge then counts once.
template <typename T, typename S>
void attend_draft_tree(const TensorView<const T, 4>& q_rows, const KVCache<T, S>& cache, Index b, Index prefix,
                       const TensorView<const bool, 4>& tree_mask, const AttentionOptions<T>& logits,
                       const TensorView<T, 4>& heads, AttentionWorkspace<T>& workspace) {
  const Index drafts = q_rows.dim(2);
  const auto attend = [&](Index first, Index count, const AttentionOptions<T>& opts) {
    AttentionPartial<T> part{Tensor<T, 4>({1, q_rows.dim(1), drafts, q_rows.dim(3)}),
                             Tensor<T, 3>({1, q_rows.dim(1), drafts})};
    const TensorView<const S, 4> keys = cached_rows(cache.sequence_keys(b), first, count);
    const TensorView<const S, 4> values = cached_rows(cache.sequence_values(b), first, count);
    run_forward_stored(over_cached(make_stored_params<T, S>(q_rows, keys, values, opts), cache, b, first, count), opts,
                       ForwardOutputs<T>{part.out.view(), part.lse.view(), TensorView<T, 4>()}, workspace);
    return part;
  };
  AttentionOptions<T> over_drafts = logits;
  over_drafts.allowed = tree_mask;
  AttentionPartial<T> result = attend(prefix, drafts, over_drafts);
  if (prefix > 0) {
    AttentionOptions<T> over_prefix_opts;
    over_prefix_opts.softcap = logits.softcap;
    const AttentionPartial<T> over_prefix = attend(0, prefix, over_prefix_opts);
    result = merge_attention_partials_views<T>(over_prefix.out, over_prefix.lse, result.out, result.lse);
  }
  for (Index h = 0; h < heads.dim(1); ++h)
    for (Index l = 0; l < drafts; ++l) std::copy_n(&result.out(0, h, l, 0), heads.dim(3), &heads(b, h, l, 0));
}

/// The walk of a checked step_tree: project -> rotate each draft at its depth after the cached tokens (not at its
/// index among the drafts) -> per sequence, append every draft and attend_draft_tree -> output projection. If
/// anything throws after an append, every sequence goes back to its length before the call.
template <typename T, typename S>
void draft_tree_walk(const MultiHeadAttentionConfig& config, const RotaryEmbedding<T>* rope,
                     const MhaParams<T>& parameters, const TensorView<const T, 3>& x, KVCache<T, S>& cache,
                     const DraftTree& tree, const TensorView<T, 3>& output, MhaWorkspace<T>& ws) {
  const Index batch = x.dim(0), drafts = x.dim(1);
  const TensorView<T, 3> qkv =
      MhaWorkspace<T>::take(ws.projection, std::array<Index, 3>{batch, drafts, qkv_projection_width(config)});
  const std::array<TensorView<T, 3>, 3> projections = project_self_into(config, parameters, x, qkv, ws.stacked);
  const TensorView<T, 4> q = split_heads(projections[0], config.num_heads);
  const TensorView<T, 4> k = split_heads(projections[1], config.num_kv_heads);
  const TensorView<T, 4> v = split_heads(projections[2], config.num_kv_heads);
  const std::vector<Index> depths = tree.depths();
  for (Index b = 0; rope && b < batch; ++b)
    for (Index l = 0; l < drafts; ++l) {
      const Index position = cache.positions()[static_cast<std::size_t>(b)] + depths[static_cast<std::size_t>(l)];
      rope->apply(rows_of(q, b, l, 1), position);
      rope->apply(rows_of(k, b, l, 1), position);
    }
  Tensor<bool, 4> tree_mask({1, 1, drafts, drafts});  // draft i sees its ancestors and itself
  for (Index i = 0; i < drafts; ++i)
    for (Index a = 0; a < drafts; ++a) tree_mask(0, 0, i, a) = tree.sees(i, a);
  const TensorView<T, 3> merged =
      MhaWorkspace<T>::take(ws.merged, std::array<Index, 3>{batch, drafts, config.embed_dim});
  AttentionOptions<T> logits;
  add_module_logits(config, parameters, logits);
  const std::vector<Index> lengths_before = cache.lengths();
  try {
    for (Index b = 0; b < batch; ++b) {
      cache.append(b, rows_of(k, b, 0, drafts)[0], rows_of(v, b, 0, drafts)[0], rope);
      attend_draft_tree<T, S>(rows_of(q, b, 0, drafts), cache, b, lengths_before[static_cast<std::size_t>(b)],
                              tree_mask.view(), logits, split_heads(merged, config.num_heads), ws.attention);
    }
  } catch (...) {  // out of memory mid-step: the cache goes back to where it was
    for (Index b = 0; b < batch; ++b) cache.truncate(b, lengths_before[static_cast<std::size_t>(b)]);
    throw;
  }
  linear_into_stored<T, T>(merged, parameters.out_weight.view(), parameters.out_bias.view(), output, ws.output_weights);
}

/// MultiHeadAttention::step_tree_with: every check, then the walk (nothing to do for an empty tree).
template <typename T, typename S, typename A>
Tensor<T, 3> draft_tree_step(const MultiHeadAttentionConfig& config, const RotaryEmbedding<T>* rope,
                             const MhaParams<T>& parameters, const TensorView<const A, 3>& x, KVCache<T, S>& cache,
                             const DraftTree& tree) {
  static_assert(std::is_same_v<A, T>, "MultiHeadAttention::step_tree: x_draft must hold the module's type");
  MhaWorkspace<T> ws;
  check_mha_step_tree(config, parameters, x, cache, tree, ws.counts, "MultiHeadAttention::step_tree");
  Tensor<T, 3> output({x.dim(0), x.dim(1), config.embed_dim});
  if (tree.size() > 0) draft_tree_walk(config, rope, parameters, x, cache, tree, output.view(), ws);
  return output;
}

}  // namespace selfattn::detail
