/// \file
/// Causal and AttentionOptions: everything that shapes one attention call
/// besides q, k and v. Semantics in docs/masks.md; validation in attention.hpp.
#pragma once

#include <selfattn/key_lengths.hpp>
#include <selfattn/tensor.hpp>

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
/// `automatic` (the default) runs the fused kernel (detail/fused.hpp: tiled online softmax, O(tile) memory
/// beyond inputs and outputs, threads under OpenMP) unless `need_weights` asks for the probabilities, which
/// only the reference kernel materialises. `reference` always runs the reference kernel
/// (detail/reference.hpp): the specification, short and slow, holding one (Lq, Lk) score matrix per (batch,
/// head); tests compare against it. `fused` asks for the fused kernel, falling back to the reference when
/// `need_weights` is set. Both kernels give the same results up to rounding, and `sdpa_backward` accepts the
/// `out` and `lse` of either forward.
enum class Kernel {
  automatic,  ///< the fused kernel, unless `need_weights` (then the reference): the default
  reference,  ///< always the reference kernel (detail/reference.hpp): the specification
  fused       ///< the fused kernel (detail/fused.hpp); `need_weights` still runs the reference
};

/// \brief Options of one attention call. Every field is optional; all masks combine by logical and.
///
/// Shapes: B batch, H query heads, Lq query length, Lk key length; `allowed` and `bias` broadcast to
/// (B, H, Lq, Lk) (NumPy rules: an extent of 1 repeats). Masks are views: the caller keeps their data alive.
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
  TensorView<const bool, 4> allowed;      ///< empty, or broadcastable to (B, H, Lq, Lk); true = may attend
  TensorView<const T, 4> bias;            ///< empty, or broadcastable to (B, H, Lq, Lk); added to the scores
  Index window_left = -1;                 ///< keys allowed left of the bottom-right diagonal; -1 = unbounded
  Index window_right = -1;                ///< keys allowed right of the bottom-right diagonal; -1 = unbounded
  std::vector<T> alibi_slopes;            ///< empty, or one slope per query head: score -= slope * |i + off - j|
  std::optional<T> scale;                 ///< score scale; default 1 / sqrt(D)
  T dropout_p = T(0);                     ///< dropout rate on the probabilities, in [0, 1)
  std::uint64_t seed = 0;                 ///< dropout stream key: same seed, same mask
  bool need_weights = false;              ///< also return the attention probabilities (B, H, Lq, Lk)
  Kernel kernel = Kernel::automatic;      ///< fused unless need_weights; `reference` forces the specification
};

}  // namespace selfattn
