/// \file
/// The key/value cache of incremental decoding, its eviction policies, and the
/// merge of attention results computed over disjoint key sets.
///
/// Layout: keys and values of shape (B, Hkv, capacity, D), one plane per key/value head (grouped-query
/// heads are stored once, never repeated per query head). Sequence b holds its tokens in rows
/// [0, lengths()[b]) of its planes: sequences of different lengths decode together, each padded on the
/// right (rows past its length are unused). Keys are stored after RoPE. MultiHeadAttention::make_cache
/// makes one and MultiHeadAttention::step fills it; docs/decoding.md explains the policies and positions.
#pragma once

#include <selfattn/detail/decode.hpp>
#include <selfattn/errors.hpp>
#include <selfattn/tensor.hpp>

#include <algorithm>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

namespace selfattn {

/// \brief Which tokens a KVCache keeps.
///
/// keep_all(): every token (the cache grows, or is bounded by a fixed capacity).
/// sliding_window(W): the last W tokens of each sequence. attention_sinks(S, W): the first S tokens
/// (StreamingLLM's attention sinks) plus the last W. With a window, positions are positions within the
/// cache (see docs/decoding.md), and memory stays at S + W + 1 token slots however long the stream.
/// \code
/// auto cache = mha.make_cache(1, CachePolicy::attention_sinks(4, 1020));   // at most 4 + 1020 tokens kept
/// \endcode
struct CachePolicy {
  Index sink_tokens = 0;  ///< with a window: the first sink_tokens tokens of a sequence are never evicted
  Index window = -1;      ///< -1: keep every token; else keep the last `window` tokens (plus the sinks)
  Index capacity = 0;     ///< token slots; 0 = grow as needed (amortised doubling); else fixed, and a step past it throws

  /// Every token: grow as needed (capacity 0), or hold at most `capacity` tokens (a step past it throws).
  static CachePolicy keep_all(Index capacity = 0) { return {0, -1, capacity}; }
  /// The last `window` tokens of each sequence (window >= 1).
  static CachePolicy sliding_window(Index window) { return {0, window, 0}; }
  /// The first `sinks` tokens (StreamingLLM's attention sinks) plus the last `window`.
  static CachePolicy attention_sinks(Index sinks, Index window) { return {sinks, window, 0}; }
  /// Whether the policy evicts tokens (it has a window).
  bool evicts() const { return window >= 0; }
};

/// \brief Keys (after RoPE) and values of the tokens seen so far, per sequence and key/value head.
///
/// Shapes: keys() and values() are (B, Hkv, capacity, D); sequence b's tokens are rows [0, lengths()[b]).
/// \code
/// auto cache = mha.make_cache(2);                   // keep every token, grow as needed
/// Tensor<float, 3> y = mha.step(prompt, cache);     // prefill (B, L, E)
/// y = mha.step(next_token, cache);                  // (B, 1, E); cache.length() == L + 1
/// \endcode
template <typename T>
class KVCache {
 public:
  /// An empty cache for `batch` sequences of `kv_heads` key/value heads of dimension `head_dim` (usually made
  /// by MultiHeadAttention::make_cache). Throws std::invalid_argument naming `batch` (< 0), `kv_heads` or
  /// `head_dim` (< 1), or `policy.window`, `policy.sink_tokens`, `policy.capacity` when the policy is invalid.
  KVCache(Index batch, Index kv_heads, Index head_dim, const CachePolicy& policy = {})
      : policy_(policy), batch_(batch), kv_heads_(kv_heads), head_dim_(head_dim),
        lengths_(static_cast<std::size_t>(std::max<Index>(batch, 0)), 0),
        seen_(static_cast<std::size_t>(std::max<Index>(batch, 0)), 0) {
    const char* fn = "KVCache";
    if (batch < 0) detail::throw_invalid(fn, "batch", "expected >= 0, got " + std::to_string(batch));
    if (kv_heads < 1) detail::throw_invalid(fn, "kv_heads", "expected >= 1, got " + std::to_string(kv_heads));
    if (head_dim < 1) detail::throw_invalid(fn, "head_dim", "expected >= 1, got " + std::to_string(head_dim));
    if (policy.window < -1 || policy.window == 0)
      detail::throw_invalid(fn, "policy.window", "expected -1 (keep all) or >= 1, got " + std::to_string(policy.window));
    if (policy.sink_tokens < 0 || (policy.sink_tokens > 0 && !policy.evicts()))
      detail::throw_invalid(fn, "policy.sink_tokens",
                            "expected 0, or >= 0 together with a window, got " + std::to_string(policy.sink_tokens));
    if (policy.capacity < 0 || (policy.evicts() && policy.capacity != 0 && policy.capacity < window_slots()))
      detail::throw_invalid(fn, "policy.capacity",
                            "expected 0 (grow) or enough slots for the policy (" + std::to_string(window_slots()) +
                                "), got " + std::to_string(policy.capacity));
    allocate(policy.capacity > 0 ? policy.capacity : 0);
  }

  Index batch() const { return batch_; }                ///< B, the number of sequences
  Index kv_heads() const { return kv_heads_; }          ///< Hkv, key/value heads
  Index head_dim() const { return head_dim_; }          ///< D, the head dim of keys and values
  const CachePolicy& policy() const { return policy_; }  ///< which tokens the cache keeps
  /// Token slots allocated per sequence and head.
  Index capacity() const { return keys_.dim(2); }
  /// Tokens cached: the longest sequence's count.
  Index length() const { return lengths_.empty() ? 0 : *std::max_element(lengths_.begin(), lengths_.end()); }
  /// Tokens cached per sequence (rows [0, lengths()[b]) of sequence b).
  const std::vector<Index>& lengths() const { return lengths_; }
  /// Tokens each sequence has seen, evicted ones included: the absolute position of its next token.
  const std::vector<Index>& positions() const { return seen_; }
  /// Keys after RoPE, (B, Hkv, capacity, D).
  TensorView<const T, 4> keys() const { return keys_; }
  /// Values, (B, Hkv, capacity, D).
  TensorView<const T, 4> values() const { return values_; }
  /// Bytes held for keys, values and the copies of the sinks' keys as first rotated: what the policy bounds.
  std::size_t memory_bytes() const {
    return sizeof(T) * static_cast<std::size_t>(keys_.size() + values_.size() + sink_keys_.size());
  }
  /// Forgets every token; keeps the allocation.
  void clear() {
    std::fill(lengths_.begin(), lengths_.end(), 0);
    std::fill(seen_.begin(), seen_.end(), 0);
  }

 private:
  template <typename>
  friend class MultiHeadAttention;

  // With a window, a sequence holds at most S + W tokens between steps and one more during a step.
  Index window_slots() const { return policy_.sink_tokens + policy_.window + 1; }

  void allocate(Index capacity) {
    keys_ = Tensor<T, 4>({batch_, kv_heads_, capacity, head_dim_});
    values_ = Tensor<T, 4>({batch_, kv_heads_, capacity, head_dim_});
    if (policy_.sink_tokens > 0) sink_keys_ = Tensor<T, 4>({batch_, kv_heads_, policy_.sink_tokens, head_dim_});
  }

  /// The capacity a step that brings the sequences to these lengths needs, or throws if a fixed capacity
  /// is too small. Changes nothing.
  Index required_capacity(const char* function, Index longest) const {
    if (policy_.evicts()) return std::max(capacity(), window_slots());
    if (policy_.capacity > 0 && longest > policy_.capacity)
      detail::throw_invalid(function, "cache", "a fixed capacity of " + std::to_string(policy_.capacity) +
                                                   " tokens cannot hold " + std::to_string(longest));
    if (longest <= capacity()) return capacity();
    return policy_.capacity > 0 ? policy_.capacity : std::max(longest, 2 * capacity());
  }

  /// New key/value planes of a larger capacity holding the current tokens (the cache itself unchanged).
  void grown_copy(Index capacity, Tensor<T, 4>& keys, Tensor<T, 4>& values) const {
    keys = Tensor<T, 4>({batch_, kv_heads_, capacity, head_dim_});
    values = Tensor<T, 4>({batch_, kv_heads_, capacity, head_dim_});
    for (Index b = 0; b < batch_; ++b)
      for (Index h = 0; h < kv_heads_; ++h) {
        const Index rows = lengths_[static_cast<std::size_t>(b)];
        as_matrix(keys[b][h]).topRows(rows) = as_matrix(keys_[b][h]).topRows(rows);
        as_matrix(values[b][h]).topRows(rows) = as_matrix(values_[b][h]).topRows(rows);
      }
  }

  CachePolicy policy_;
  Index batch_, kv_heads_, head_dim_;
  Tensor<T, 4> keys_, values_;
  Tensor<T, 4> sink_keys_;  // the sinks' keys as first rotated (at their own positions), see evict()
  std::vector<Index> lengths_, seen_;
};

/// \brief An attention result over some set of keys: out (B, H, Lq, Dv) and its log-sum-exp lse (B, H, Lq).
template <typename T>
struct AttentionPartial {
  Tensor<T, 4> out;  ///< (B, H, Lq, Dv): attention output over the key set
  Tensor<T, 3> lse;  ///< (B, H, Lq): log-sum-exp of the scores over the allowed keys; -inf when none
};

/// \brief Merges two attention results over disjoint key sets of the same queries into the result over
/// their union: lse = log(e^lse_a + e^lse_b), out = e^(lse_a - lse) out_a + e^(lse_b - lse) out_b.
///
/// The building block for splitting attention over keys: across threads (the decode kernel does this),
/// across processes or machines, or over a cache kept in pieces. A side with lse = -inf saw no allowed
/// key and contributes nothing. Throws ShapeError naming `out_b`, `lse_a` or `lse_b` when shapes differ.
///
/// Shapes: out_a, out_b (B, H, Lq, Dv); lse_a, lse_b (B, H, Lq) -> out (B, H, Lq, Dv), lse (B, H, Lq).
/// \code
/// auto a = sdpa_forward(q, k_first_half, v_first_half), b = sdpa_forward(q, k_second_half, v_second_half);
/// auto all = merge_attention_partials(a.out, a.lse, b.out, b.lse);   // == sdpa_forward(q, k, v)
/// \endcode
template <typename OA, typename LA, typename OB, typename LB,
          typename = std::enable_if_t<detail::is_tensor_of_rank<OA, 4> && detail::is_tensor_of_rank<LA, 3> &&
                                      detail::is_tensor_of_rank<OB, 4> && detail::is_tensor_of_rank<LB, 3>>>
AttentionPartial<detail::scalar_of<OA>> merge_attention_partials(const OA& out_a, const LA& lse_a, const OB& out_b,
                                                                 const LB& lse_b) {
  using T = detail::scalar_of<OA>;
  static_assert(std::is_same_v<detail::scalar_of<LA>, T> && std::is_same_v<detail::scalar_of<OB>, T> &&
                    std::is_same_v<detail::scalar_of<LB>, T>,
                "merge_attention_partials: one element type");
  const char* fn = "merge_attention_partials";
  const TensorView<const T, 4> oa = detail::const_view(out_a), ob = detail::const_view(out_b);
  const TensorView<const T, 3> la = detail::const_view(lse_a), lb = detail::const_view(lse_b);
  detail::check_shape<4>(fn, "out_b", ob.shape(), oa.shape());
  detail::check_shape<3>(fn, "lse_a", la.shape(), {oa.dim(0), oa.dim(1), oa.dim(2)});
  detail::check_shape<3>(fn, "lse_b", lb.shape(), {oa.dim(0), oa.dim(1), oa.dim(2)});
  AttentionPartial<T> merged{Tensor<T, 4>(oa.shape()), Tensor<T, 3>(la.shape())};
  for (Index b = 0; b < oa.dim(0); ++b)
    for (Index h = 0; h < oa.dim(1); ++h)
      for (Index i = 0; i < oa.dim(2); ++i)
        merged.lse(b, h, i) = detail::merge_partial_rows(la(b, h, i), as_vector(oa[b][h][i]), lb(b, h, i),
                                                         as_vector(ob[b][h][i]), as_vector(merged.out[b][h][i]));
  return merged;
}

}  // namespace selfattn
