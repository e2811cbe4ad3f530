/// \file
/// Causal, Kernel and AttentionOptions: everything that shapes one attention call
/// besides q, k and v. Semantics in docs/masks.md; validation in attention.hpp.
#pragma once

#include <selfattn/key_lengths.hpp>
#include <selfattn/mask_view.hpp>
#include <selfattn/tensor.hpp>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <vector>

namespace selfattn {

/// \brief Causal masking. With `off = Lk - Lq`: `top_left` allows `j <= i` (PyTorch's `is_causal`),
/// `bottom_right` allows `j <= i + off` (FlashAttention's; right for queries at the end of a KV cache).
enum class Causal {
  none,         ///< no causal mask: every key may be seen
  top_left,     ///< key j visible to query i iff j <= i (PyTorch's `is_causal`)
  bottom_right  ///< key j visible to query i iff j <= i + Lk - Lq (FlashAttention's); top_left when Lq == Lk
};

/// \brief Which attention kernel runs a call.
///
/// `automatic` (the default) chooses: the reference kernel when `need_weights` asks for the probabilities (only
/// it materialises them); the decode kernel (detail/decode.hpp: keys split into chunks across threads, partials
/// merged by log-sum-exp) when there are at most 16 query rows per head, as in incremental decoding; otherwise
/// the fused kernel (detail/kernels/fused_forward.inc: tiled online softmax, O(tile) memory beyond inputs and outputs).
/// The other values ask for one kernel; `need_weights` still runs the reference. Every kernel gives the same
/// results up to rounding, and `sdpa_backward` accepts the `out` and `lse` of any forward. The backward has two
/// kernels: `reference` runs the reference backward, every other value the fused one.
enum class Kernel {
  automatic,  ///< reference if need_weights, decode for Lq <= 16, else fused: the default
  reference,  ///< always the reference kernel (detail/reference.hpp): the specification
  fused,      ///< the fused kernel (detail/kernels/fused_forward.inc, fused_backward.inc)
  decode      ///< the decode kernel (detail/decode.hpp), any Lq; its backward is the fused one
};

/// \brief Options of one attention call. Every field is optional; all masks combine by logical and.
///
/// Shapes: B batch, H query heads, Lq query length, Lk key length; `allowed` and `bias` broadcast to
/// (B, H, Lq, Lk) (NumPy rules: an extent of 1 repeats, missing leading dimensions are 1, so they take a tensor
/// of rank 2 (Lq, Lk), 3 (H, Lq, Lk) or 4; see MaskView). Masks are views: the caller keeps their data alive.
/// \code
/// AttentionOptions<float> opts;
/// opts.causal = Causal::top_left;
/// opts.key_lengths = {8, 5};        // keys >= length are padding, per batch
/// auto out = scaled_dot_product_attention(q, k, v, opts);
/// \endcode
template <typename T>
struct AttentionOptions {
  Causal causal = Causal::none;           ///< causal mask alignment
  KeyLengths key_lengths;                 ///< empty, or B entries in [0, Lk]: key j of batch b is valid iff j < key_lengths[b]
  MaskView<bool> allowed;                 ///< empty, or rank 2-4 broadcastable to (B, H, Lq, Lk); true = may attend
  MaskView<T> bias;                       ///< empty, or rank 2-4 broadcastable to (B, H, Lq, Lk); added to the scores
  Index window_left = -1;                 ///< keys allowed left of the bottom-right diagonal; -1 = unbounded
  Index window_right = -1;                ///< keys allowed right of the bottom-right diagonal; -1 = unbounded
  std::vector<T> alibi_slopes;            ///< empty, or one slope per query head: score -= slope * |i + off - j|
  T softcap = T(0);                       ///< > 0: scores c tanh(scale q.k / c), before bias and ALiBi; 0 = off
  std::vector<T> sinks;                   ///< empty, or one logit per query head: joins each row's softmax, no value
  std::optional<T> scale;                 ///< score scale; default 1 / sqrt(D)
  T dropout_p = T(0);                     ///< dropout rate on the probabilities, in [0, 1)
  std::uint64_t seed = 0;                 ///< dropout stream key: same seed, same mask
  bool need_weights = false;              ///< also return the attention probabilities (B, H, Lq, Lk)
  Kernel kernel = Kernel::automatic;      ///< which kernel runs the call (see Kernel); the default chooses
};

namespace detail {

/// Sequence b's part of a broadcastable (B|1, H|1, Lq|1, Lk|1) mask: query rows [row, row + rows), keys
/// [0, keys). Extent-1 dimensions stay 1 (they broadcast).
template <typename U>
TensorView<const U, 4> mask_for_sequence(const TensorView<const U, 4>& mask, Index b, Index row, Index rows,
                                         Index keys) {
  if (!mask.data()) return mask;
  const U* data = mask.data() + (mask.dim(0) == 1 ? 0 : b * mask.stride(0)) + (mask.dim(2) == 1 ? 0 : row * mask.stride(2));
  return TensorView<const U, 4>(data, {1, mask.dim(1), mask.dim(2) == 1 ? 1 : rows, mask.dim(3) == 1 ? 1 : keys},
                                mask.strides());
}

/// The options of sequence b of a batched call, for its query rows [row, row + rows) over its first `keys` keys:
/// its key length (at most `keys`) and its slices of the masks. Everything else is shared.
/// This form assigns into `sequence` (not `opts`), whose vectors keep their capacity: nothing is allocated once
/// it has held options of the same sizes.
template <typename T>
void options_for_sequence(const AttentionOptions<T>& opts, Index b, Index row, Index rows, Index keys,
                          AttentionOptions<T>& sequence) {
  sequence = opts;
  if (!opts.key_lengths.empty())
    sequence.key_lengths.assign(1, std::min(opts.key_lengths[static_cast<std::size_t>(b)], keys));
  sequence.allowed = mask_for_sequence(opts.allowed, b, row, rows, keys);
  sequence.bias = mask_for_sequence(opts.bias, b, row, rows, keys);
}

template <typename T>
AttentionOptions<T> options_for_sequence(const AttentionOptions<T>& opts, Index b, Index row, Index rows, Index keys) {
  AttentionOptions<T> sequence;
  options_for_sequence(opts, b, row, rows, keys, sequence);
  return sequence;
}

}  // namespace detail

}  // namespace selfattn
