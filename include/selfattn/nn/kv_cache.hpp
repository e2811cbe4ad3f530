/// \file
/// The key/value cache of incremental decoding and its eviction policies.
///
/// Layout: keys and values of shape (B, Hkv, capacity, D), one plane per key/value head (grouped-query
/// heads are stored once, never repeated per query head). Sequence b holds its tokens in rows
/// [0, lengths()[b]) of its planes: sequences of different lengths decode together, each padded on the
/// right (rows past its length are unused). Keys are stored after RoPE. The cache owns its behaviour:
/// appending, growing, evicting under its policy (with the RoPE re-rotation of the sinks), truncating, and
/// the per-sequence views attention reads. MultiHeadAttention::make_cache makes one and
/// MultiHeadAttention::step fills it; docs/decoding.md explains the policies and positions.
#pragma once

#include <selfattn/detail/checked_size.hpp>
#include <selfattn/detail/params.hpp>
#include <selfattn/errors.hpp>
#include <selfattn/half_precision.hpp>
#include <selfattn/nn/module_workspace.hpp>
#include <selfattn/positional.hpp>
#include <selfattn/quantized.hpp>
#include <selfattn/tensor.hpp>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <stdexcept>
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
/// T is the module's type (what append receives); S is the storage type of keys and values: T by default,
/// bfloat16 / float16 (with T = float) for half the memory and half the bytes each decode step reads, or std::int8_t
/// (with T = float) with a bfloat16 scale per block of 32 values (quantized.hpp): 17/64 of float's bytes. Keys and
/// values are rounded to S once (to nearest even; int8: quantised by quantize_int8_row) when they are appended;
/// attention reads them in place (docs/int8_cache.md for the int8 cache's error rule).
///
/// Shapes: keys() and values() are (B, Hkv, capacity, D); sequence b's tokens are rows [0, lengths()[b]).
/// \code
/// auto cache = mha.make_cache(2);                   // keep every token, grow as needed
/// Tensor<float, 3> y = mha.step(prompt, cache);     // prefill (B, L, E)
/// y = mha.step(next_token, cache);                  // (B, 1, E); cache.length() == L + 1
/// auto half = mha.make_cache<bfloat16>(2);          // KVCache<float, bfloat16>: 2 bytes per element
/// auto int8 = mha.make_cache<std::int8_t>(2);       // KVCache<float, std::int8_t>: 1 byte, plus 2 per 32
/// \endcode
template <typename T, typename S = T>
class KVCache {
  static_assert(std::is_same_v<S, T> ||
                    ((is_half_width_v<S> || std::is_same_v<S, std::int8_t>)&&std::is_same_v<T, float>),
                "selfattn::KVCache<T, S>: S is T, or bfloat16 / float16 / std::int8_t with T = float");

 public:
  using value_type = T;    ///< what append takes and attention computes in
  using storage_type = S;  ///< what keys and values are stored as
  /// Whether keys and values are int8 with block scales (S = std::int8_t).
  static constexpr bool quantized = std::is_same_v<S, std::int8_t>;

  /// An empty cache for `batch` sequences of `kv_heads` key/value heads of dimension `head_dim` (usually made
  /// by MultiHeadAttention::make_cache). Throws std::invalid_argument naming `batch` (< 0), `kv_heads` or
  /// `head_dim` (< 1), or `policy.window`, `policy.sink_tokens`, `policy.capacity` when the policy is invalid;
  /// std::length_error naming the size (`policy.capacity`, `policy.window`, `policy.sink_tokens`, `head_dim`,
  /// `batch`) when the planes at the policy's capacity would exceed max_capacity(). Nothing is allocated before.
  KVCache(Index batch, Index kv_heads, Index head_dim, const CachePolicy& policy = {})
      : policy_(policy), batch_(batch), kv_heads_(kv_heads), head_dim_(head_dim) {
    const char* fn = "KVCache";
    if (batch < 0) detail::throw_invalid(fn, "batch", "expected >= 0, got " + std::to_string(batch));
    if (kv_heads < 1) detail::throw_invalid(fn, "kv_heads", "expected >= 1, got " + std::to_string(kv_heads));
    if (head_dim < 1) detail::throw_invalid(fn, "head_dim", "expected >= 1, got " + std::to_string(head_dim));
    if (policy.window < -1 || policy.window == 0)
      detail::throw_invalid(fn, "policy.window", "expected -1 (keep all) or >= 1, got " + std::to_string(policy.window));
    if (policy.sink_tokens < 0 || (policy.sink_tokens > 0 && !policy.evicts()))
      detail::throw_invalid(fn, "policy.sink_tokens",
                            "expected 0, or >= 0 together with a window, got " + std::to_string(policy.sink_tokens));
    check_window_size();
    if (policy.capacity < 0 || (policy.evicts() && policy.capacity != 0 && policy.capacity < window_slots()))
      detail::throw_invalid(fn, "policy.capacity",
                            "expected 0 (grow) or enough slots for the policy (" + std::to_string(window_slots()) +
                                "), got " + std::to_string(policy.capacity));
    max_capacity_ = checked_max_capacity();
    check_capacity_fits();
    check_sequences_fit();
    lengths_.assign(static_cast<std::size_t>(batch), 0);
    seen_ = lengths_;
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
  TensorView<const S, 4> keys() const { return keys_; }
  /// Values, (B, Hkv, capacity, D).
  TensorView<const S, 4> values() const { return values_; }
  /// The int8 cache's key scales, (B, Hkv, capacity, int8_blocks(D)): block c of key (b, h, j) is
  /// keys()(b, h, j, 32c ..) times key_scales()(b, h, j, c). Empty for other storage types.
  TensorView<const bfloat16, 4> key_scales() const { return key_scales_; }
  /// The int8 cache's value scales, like key_scales().
  TensorView<const bfloat16, 4> value_scales() const { return value_scales_; }
  /// The most token slots per sequence the cache can hold: its keys, values and sink keys together at most
  /// detail::max_object_size (PTRDIFF_MAX) bytes. A fixed or windowed capacity above it throws when constructed.
  Index max_capacity() const { return max_capacity_; }
  /// Bytes held for keys, values (with an int8 cache's scales) and the copies of the sinks' keys as first rotated:
  /// what the policy bounds.
  std::size_t memory_bytes() const {
    return sizeof(S) * static_cast<std::size_t>(keys_.size() + values_.size()) +
           sizeof(bfloat16) * static_cast<std::size_t>(key_scales_.size() + value_scales_.size()) +
           sizeof(T) * static_cast<std::size_t>(sink_keys_.size());
  }
  /// Forgets every token; keeps the allocation.
  void clear() {
    std::fill(lengths_.begin(), lengths_.end(), 0);
    std::fill(seen_.begin(), seen_.end(), 0);
  }

  /// Whether the policy lets a sequence hold `tokens` tokens at once (only a fixed capacity limits it).
  bool fits(Index tokens) const { return policy_.capacity == 0 || tokens <= policy_.capacity; }

  /// \brief Room for `tokens` tokens per sequence: grows the planes (doubling; to the fixed capacity; or, under
  /// an evicting policy, to its S + W + 1 slots at once), keeping every cached token. Throws
  /// std::invalid_argument naming `tokens` when a fixed capacity is too small, std::length_error naming it when the
  /// planes of that many tokens would exceed detail::max_object_size bytes (max_capacity()).
  /// If it throws (or runs out of memory), the cache is unchanged.
  void reserve(Index tokens) {
    if (!fits(tokens))
      detail::throw_invalid("KVCache::reserve", "tokens", "a fixed capacity of " + std::to_string(policy_.capacity) +
                                                             " tokens cannot hold " + std::to_string(tokens));
    if (tokens > max_capacity_)
      throw std::length_error(detail::size_limit_message("KVCache::reserve", "tokens",
                                                         std::to_string(tokens) + " tokens of " + planes_text("tokens"),
                                                         max_capacity_, "tokens"));
    if (tokens <= capacity()) return;
    // Doubling cannot wrap: a slot takes 2 * sizeof(S) >= 4 bytes (int8: counted as 68 per block), so max_capacity_
    // is at most a quarter of Index's range.
    const Index grown = policy_.capacity > 0 ? policy_.capacity
                        : policy_.evicts()   ? std::max(tokens, window_slots())
                                             : std::max(tokens, std::min(2 * capacity(), max_capacity_));
    Tensor<S, 4> keys({batch_, kv_heads_, grown, head_dim_}), values({batch_, kv_heads_, grown, head_dim_});
    Tensor<bfloat16, 4> key_scales(scales_shape(grown)), value_scales(scales_shape(grown));
    for (Index b = 0; b < batch_; ++b)
      for (Index h = 0; h < kv_heads_; ++h) {
        const Index rows = lengths_[static_cast<std::size_t>(b)];
        as_matrix(keys[b][h]).topRows(rows) = as_matrix(keys_[b][h]).topRows(rows);
        as_matrix(values[b][h]).topRows(rows) = as_matrix(values_[b][h]).topRows(rows);
        if constexpr (quantized) {
          as_matrix(key_scales[b][h]).topRows(rows) = as_matrix(key_scales_[b][h]).topRows(rows);
          as_matrix(value_scales[b][h]).topRows(rows) = as_matrix(value_scales_[b][h]).topRows(rows);
        }
      }
    keys_ = std::move(keys);
    values_ = std::move(values);
    key_scales_ = std::move(key_scales);
    value_scales_ = std::move(value_scales);
  }

  /// \brief Appends n tokens to sequence b: keys (after RoPE, at positions positions()[b] ..) and values, both
  /// (Hkv, n, D), rounded to the storage type S once here; then evicts what the policy drops. `rope` is the rotation the keys were made with (null
  /// without RoPE): with attention sinks, evicting re-rotates the sinks' keys with it (see evict below).
  ///
  /// Throws ShapeError naming `keys` or `values`, std::invalid_argument naming `b` or `tokens` (a fixed
  /// capacity too small), before anything changes.
  /// \code
  /// cache.append(0, new_keys, new_values);   // (Hkv, n, D) each; cache.lengths()[0] grows by n
  /// \endcode
  void append(Index b, const TensorView<const T, 3>& keys, const TensorView<const T, 3>& values,
              const RotaryEmbedding<T>* rope = nullptr) {
    const char* fn = "KVCache::append";
    if (b < 0 || b >= batch_)
      detail::throw_invalid(fn, "b", "expected a sequence in [0, " + std::to_string(batch_) + "), got " + std::to_string(b));
    detail::check_shape<3>(fn, "keys", keys.shape(), {kv_heads_, detail::any_extent, head_dim_});
    detail::check_shape<3>(fn, "values", values.shape(), {kv_heads_, keys.dim(1), head_dim_});
    Index& length = lengths_[static_cast<std::size_t>(b)];
    const Index n = keys.dim(1);  // a view of stride 0 may show more rows than memory holds: the sum is checked
    reserve(detail::checked_add(length, n, detail::max_object_size, [&] {
      return detail::size_limit_message(fn, "keys", std::to_string(length) + " cached tokens plus " + std::to_string(n),
                                        detail::max_object_size, "tokens");
    }));
    for (Index h = 0; h < kv_heads_; ++h)
      for (Index l = 0; l < n; ++l) {
        const Index slot = length + l;
        store_row(&keys(h, l, 0), keys_, key_scales_, b, h, slot);
        store_row(&values(h, l, 0), values_, value_scales_, b, h, slot);
        if (slot < policy_.sink_tokens) as_vector(sink_keys_[b][h][slot]) = as_vector(keys[h][l]);
      }
    length += n;
    seen_[static_cast<std::size_t>(b)] += n;
    evict(b, rope);
  }

  /// \brief Forgets the tokens of sequence b past its first `length` (a rejected draft of speculative decoding,
  /// or a step to undo); positions() go back with them. Not under an evicting policy (its positions are no
  /// longer tokens' positions): throws std::invalid_argument naming `policy`; naming `length` outside
  /// [0, lengths()[b]].
  void truncate(Index b, Index length) {
    const char* fn = "KVCache::truncate";
    if (policy_.evicts()) detail::throw_invalid(fn, "policy", "cannot truncate a cache that evicts tokens");
    if (b < 0 || b >= batch_)
      detail::throw_invalid(fn, "b", "expected a sequence in [0, " + std::to_string(batch_) + "), got " + std::to_string(b));
    Index& current = lengths_[static_cast<std::size_t>(b)];
    if (length < 0 || length > current)
      detail::throw_invalid(fn, "length",
                            "expected a value in [0, " + std::to_string(current) + "], got " + std::to_string(length));
    seen_[static_cast<std::size_t>(b)] -= current - length;
    current = length;
  }

  /// \brief After a tree of drafts was verified (MultiHeadAttention::step_tree appended them all at
  /// `draft_start`), keeps only the accepted path: the drafts `path` (indices into the tree, strictly increasing,
  /// as DraftTree::path_to gives them) move to slots draft_start, draft_start + 1, ... in order, and every other
  /// draft is forgotten; positions() go back with them. The drafts were rotated at position prefix + depth, and a
  /// path's depths are 0, 1, 2, ...: the kept keys are where k one-token steps would have put them. An empty path
  /// rejects every draft (truncate(b, draft_start)).
  ///
  /// Throws std::invalid_argument naming `policy` under an evicting policy, `b` outside [0, batch()),
  /// `draft_start` outside [0, lengths()[b]], or `path` when its entries are not strictly increasing drafts in
  /// [0, lengths()[b] - draft_start); nothing changes then.
  /// \code
  /// const Index start = cache.lengths()[0];
  /// auto y = mha.step_tree(drafts, cache, tree);            // verify every draft of the tree at once
  /// cache.keep_draft_path(0, start, tree.path_to(leaf));    // keep the accepted ones
  /// \endcode
  void keep_draft_path(Index b, Index draft_start, const std::vector<Index>& path) {
    const char* fn = "KVCache::keep_draft_path";
    if (policy_.evicts()) detail::throw_invalid(fn, "policy", "cannot keep a draft path in a cache that evicts tokens");
    if (b < 0 || b >= batch_)
      detail::throw_invalid(fn, "b",
                            "expected a sequence in [0, " + std::to_string(batch_) + "), got " + std::to_string(b));
    Index& length = lengths_[static_cast<std::size_t>(b)];
    if (draft_start < 0 || draft_start > length)
      detail::throw_invalid(
          fn, "draft_start",
          "expected a value in [0, " + std::to_string(length) + "], got " + std::to_string(draft_start));
    for (std::size_t i = 0; i < path.size(); ++i)
      if (path[i] < (i == 0 ? 0 : path[i - 1] + 1) || path[i] >= length - draft_start)
        detail::throw_invalid(fn, "path",
                              "expected strictly increasing drafts in [0, " + std::to_string(length - draft_start) +
                                  "), got path[" + std::to_string(i) + "] = " + std::to_string(path[i]));
    // path[i] >= i: every row moves down or stays, and rows are read before they are overwritten
    for (std::size_t i = 0; i < path.size(); ++i) {
      const Index from = draft_start + path[i], to = draft_start + static_cast<Index>(i);
      if (from == to) continue;
      for (Index h = 0; h < kv_heads_; ++h) {
        std::copy_n(&keys_(b, h, from, 0), head_dim_, &keys_(b, h, to, 0));
        std::copy_n(&values_(b, h, from, 0), head_dim_, &values_(b, h, to, 0));
        if constexpr (quantized) {
          const Index blocks = int8_blocks(head_dim_);
          std::copy_n(&key_scales_(b, h, from, 0), blocks, &key_scales_(b, h, to, 0));
          std::copy_n(&value_scales_(b, h, from, 0), blocks, &value_scales_(b, h, to, 0));
        }
      }
    }
    const Index kept = draft_start + static_cast<Index>(path.size());
    seen_[static_cast<std::size_t>(b)] -= length - kept;
    length = kept;
  }

  /// The buffers MultiHeadAttention::step_into reuses from step to step for this cache's sequences (projections,
  /// heads, lse, the kernels' scratch); like the cache, per-sequence state of one caller at a time. Copied with
  /// the cache; clear() keeps it.
  MhaWorkspace<T>& step_workspace() { return workspace_; }

  /// Sequence b's cached keys (after RoPE), (1, Hkv, lengths()[b], D): what attention reads.
  TensorView<const S, 4> sequence_keys(Index b) const { return sequence(keys_, b); }
  /// Sequence b's cached values, (1, Hkv, lengths()[b], D).
  TensorView<const S, 4> sequence_values(Index b) const { return sequence(values_, b); }
  /// The int8 cache's scales of sequence b's keys, (1, Hkv, lengths()[b], int8_blocks(D)); empty for other storage.
  TensorView<const bfloat16, 4> sequence_key_scales(Index b) const { return sequence(key_scales_, b); }
  /// The int8 cache's scales of sequence b's values, like sequence_key_scales.
  TensorView<const bfloat16, 4> sequence_value_scales(Index b) const { return sequence(value_scales_, b); }

 private:
  // With a window, a sequence holds at most S + W tokens between appends and one more during a step.
  Index window_slots() const { return policy_.sink_tokens + policy_.window + 1; }

  /// "keys and values of shape (B, Hkv, <tokens>, D)": what a size error is about.
  std::string planes_text(const std::string& tokens) const {
    return "keys and values of shape (" + std::to_string(batch_) + ", " + std::to_string(kv_heads_) + ", " + tokens +
           ", " + std::to_string(head_dim_) + ")";
  }

  /// Throws std::length_error naming `policy.window` when S + W + 1 (window_slots) wraps.
  void check_window_size() const {
    if (!policy_.evicts()) return;
    detail::checked_add(policy_.sink_tokens, policy_.window, detail::max_object_size - 1, [&] {
      return detail::size_limit_message("KVCache", "policy.window",
                                        "sink_tokens + window + 1 = " + std::to_string(policy_.sink_tokens) + " + " +
                                            std::to_string(policy_.window) + " + 1",
                                        detail::max_object_size, "token slots");
    });
  }

  /// The most token slots per sequence whose keys and values, 2 * B * Hkv * slots * D * sizeof(S) bytes (int8: at most
  /// 34 bytes per block of 32 values, with its scale), plus
  /// the sinks' keys, B * Hkv * sink_tokens * D * sizeof(T) bytes, fit in detail::max_object_size bytes. Throws
  /// std::length_error naming `head_dim` when not even one slot does, `policy.sink_tokens` when the sinks do not.
  /// B counts as 1 at least: an empty batch's planes still have strides that multiply the other extents.
  Index checked_max_capacity() const {
    const Index limit = detail::max_object_size, rows = std::max<Index>(batch_, 1);
    // int8: counted as whole blocks of 34 bytes (32 values and a bfloat16 scale), which bounds D + 2 ceil(D / 32).
    const std::array<Index, 4> slot =
        quantized ? std::array<Index, 4>{rows, kv_heads_, int8_blocks(head_dim_), 2 * (int8_block + 2)}
                  : std::array<Index, 4>{rows, kv_heads_, head_dim_, static_cast<Index>(2 * sizeof(S))};
    const Index slot_bytes =
        detail::checked_product(slot, limit, [&] {
          return detail::size_limit_message("KVCache", "head_dim",
                                            "one token slot of " + planes_text("1") + ", in bytes,", limit, "bytes");
        });
    const std::array<Index, 5> sinks{rows, kv_heads_, policy_.sink_tokens, head_dim_, static_cast<Index>(sizeof(T))};
    const Index sink_bytes = detail::checked_product(sinks, limit, [&] {
      return detail::size_limit_message("KVCache", "policy.sink_tokens",
                                        std::to_string(policy_.sink_tokens) + " sink keys of " + planes_text("1") +
                                            ", in bytes,",
                                        limit, "bytes");
    });
    return (limit - sink_bytes) / slot_bytes;
  }

  /// Throws std::length_error naming `batch` when the per-sequence lengths and positions (two Index each) would
  /// exceed detail::max_object_size bytes: the planes' check bounds B * Hkv * D * 2 * sizeof(S), as little as 4 B.
  void check_sequences_fit() const {
    detail::checked_mul(batch_, 2 * static_cast<Index>(sizeof(Index)), detail::max_object_size, [&] {
      return detail::size_limit_message("KVCache", "batch",
                                        std::to_string(batch_) + " sequences' lengths and positions, in bytes,",
                                        detail::max_object_size, "bytes");
    });
  }

  /// Throws std::length_error naming `policy.capacity` (or `policy.window`, whose slots are allocated at once)
  /// when the cache's planes at that capacity would exceed max_capacity().
  void check_capacity_fits() const {
    const bool fixed = policy_.capacity > 0;
    if (!fixed && !policy_.evicts()) return;  // grows as tokens arrive: reserve checks each growth
    const Index slots = fixed ? policy_.capacity : window_slots();
    if (slots <= max_capacity_) return;
    throw std::length_error(detail::size_limit_message(
        "KVCache", fixed ? "policy.capacity" : "policy.window",
        "a capacity of " + std::to_string(slots) + " token slots (" + planes_text(std::to_string(slots)) +
            ", sinks' keys included)",
        max_capacity_, "token slots"));
  }

  void allocate(Index capacity) {
    keys_ = Tensor<S, 4>({batch_, kv_heads_, capacity, head_dim_});
    values_ = Tensor<S, 4>({batch_, kv_heads_, capacity, head_dim_});
    key_scales_ = Tensor<bfloat16, 4>(scales_shape(capacity));
    value_scales_ = Tensor<bfloat16, 4>(scales_shape(capacity));
    if (policy_.sink_tokens > 0) {
      sink_keys_ = Tensor<T, 4>({batch_, kv_heads_, policy_.sink_tokens, head_dim_});
      rotated_sink_.resize(static_cast<std::size_t>(head_dim_));
    }
  }

  /// The shape of an int8 cache's scale planes at `capacity` slots: (B, Hkv, capacity, int8_blocks(D)); empty for
  /// other storage.
  std::array<Index, 4> scales_shape(Index capacity) const {
    if constexpr (quantized) return {batch_, kv_heads_, capacity, int8_blocks(head_dim_)};
    static_cast<void>(capacity);
    return {0, 0, 0, 0};
  }

  template <typename U>
  TensorView<const U, 4> sequence(const Tensor<U, 4>& plane, Index b) const {
    if (plane.dim(1) == 0) return {};  // the scales of a cache that is not int8: none
    return TensorView<const U, 4>(plane.data() + b * plane.view().stride(0),
                                  {1, kv_heads_, lengths_[static_cast<std::size_t>(b)], plane.dim(3)},
                                  plane.view().strides());
  }

  /// Stores one row of D values at slot (b, h, slot): rounded to S, or quantised with its block scales (int8).
  void store_row(const T* row, Tensor<S, 4>& plane, Tensor<bfloat16, 4>& scales, Index b, Index h, Index slot) {
    if constexpr (quantized)
      quantize_int8_row(row, head_dim_, &plane(b, h, slot, 0), &scales(b, h, slot, 0));
    else
      detail::convert_row(row, &plane(b, h, slot, 0), head_dim_);
  }

  /// Drops sequence b's oldest non-sink tokens beyond the window. Positions stay positions within the cache:
  /// the kept window keys were rotated at their absolute positions, which differ from their in-cache positions
  /// by the same count `evicted` as the query's; RoPE depends only on differences, so only the sinks need turning
  /// forward by `evicted`, from their first rotation (one rotation, no drift).
  void evict(Index b, const RotaryEmbedding<T>* rope) {
    if (!policy_.evicts()) return;
    const Index sinks = policy_.sink_tokens, window = policy_.window;
    Index& length = lengths_[static_cast<std::size_t>(b)];
    if (length <= sinks + window) return;
    const Index dropped = length - (sinks + window);
    for (Index h = 0; h < kv_heads_; ++h) {
      for (Tensor<S, 4>* plane : {&keys_, &values_}) drop_rows(*plane, b, h, sinks, dropped, window);
      if constexpr (quantized)
        for (Tensor<bfloat16, 4>* plane : {&key_scales_, &value_scales_})
          drop_rows(*plane, b, h, sinks, dropped, window);
    }
    length = sinks + window;
    if (!rope || sinks == 0) return;
    const Index evicted = seen_[static_cast<std::size_t>(b)] - length;
    // Rotated in T from the first rotation, then stored as S (one rounding, as for every appended key).
    for (Index h = 0; h < kv_heads_; ++h)
      for (Index s = 0; s < sinks; ++s) {
        std::copy(&sink_keys_(b, h, s, 0), &sink_keys_(b, h, s, 0) + head_dim_, rotated_sink_.data());
        rope->apply(TensorView<T, 4>(rotated_sink_.data(), {1, 1, 1, head_dim_}), evicted);
        store_row(rotated_sink_.data(), keys_, key_scales_, b, h, s);
      }
  }

  /// Moves rows [sinks + dropped, sinks + dropped + window) of plane (b, h) down to row `sinks`.
  template <typename U>
  static void drop_rows(Tensor<U, 4>& plane, Index b, Index h, Index sinks, Index dropped, Index window) {
    const Index width = plane.dim(3);
    U* base = plane.data() + (b * plane.dim(1) + h) * plane.dim(2) * width;
    std::memmove(base + sinks * width, base + (sinks + dropped) * width,
                 static_cast<std::size_t>(window * width) * sizeof(U));
  }

  CachePolicy policy_;
  Index batch_, kv_heads_, head_dim_;
  Index max_capacity_ = 0;  // token slots per sequence that fit in memory's limit: checked_max_capacity()
  Tensor<S, 4> keys_, values_;
  Tensor<bfloat16, 4> key_scales_, value_scales_;  // int8 storage: a scale per block of 32 (quantized.hpp); else empty
  Tensor<T, 4> sink_keys_;  // the sinks' keys as first rotated (at their own positions), in T, see evict()
  std::vector<T> rotated_sink_;  // one sink key re-rotated in T before it is stored (evict)
  std::vector<Index> lengths_, seen_;
  MhaWorkspace<T> workspace_;  // step_into's buffers
};

namespace detail {

/// Rows [first, first + count) of a (1, Hkv, L, width) view of one sequence.
template <typename U>
TensorView<const U, 4> cached_rows(const TensorView<const U, 4>& plane, Index first, Index count) {
  return TensorView<const U, 4>(plane.data() + first * plane.stride(2), {1, plane.dim(1), count, plane.dim(3)},
                                plane.strides());
}

/// Kernel parameters over sequence b's cached keys and values [first, first + count) of `cache`: `p` (q, options)
/// with k, v and, for an int8 cache, their block scales.
template <typename T, typename S>
AttentionParams<T, S> over_cached(AttentionParams<T, S> p, const KVCache<T, S>& cache, Index b, Index first,
                                  Index count) {
  p.k = cached_rows(cache.sequence_keys(b), first, count);
  p.v = cached_rows(cache.sequence_values(b), first, count);
  if constexpr (KVCache<T, S>::quantized) {
    p.k_scales = cached_rows(cache.sequence_key_scales(b), first, count);
    p.v_scales = cached_rows(cache.sequence_value_scales(b), first, count);
  }
  return p;
}

}  // namespace detail

}  // namespace selfattn
