// selfattn/detail/params.hpp — what every attention kernel receives: the inputs and options of one call as one
// small struct, filled after validation (attention.hpp), and the views a forward or backward kernel writes.
// Kernels assume valid input and never throw.
#pragma once

#include <selfattn/detail/dropout.hpp>
#include <selfattn/detail/mask.hpp>
#include <selfattn/half_precision.hpp>
#include <selfattn/tensor.hpp>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

namespace selfattn::detail {

/// Keys and values in pages of a pool (PagedKVCache, paged_attention.hpp) rather than one (B, Hkv, Lk, D) tensor:
/// k and v of AttentionParams are then the pools (pages, Hkv, page_rows, D), and key j of batch b is row
/// j % page_rows of page table[b * table_stride + j / page_rows]. Absent (table null) for every other call.
struct KeyPages {
  const std::int32_t* table = nullptr;  ///< B rows of table_stride page numbers
  Index table_stride = 0;
  Index page_rows = 0;  ///< a power of two
  Index keys = 0;       ///< Lk of the call: the longest sequence's keys

  bool present() const { return table != nullptr; }
  /// The page holding key j of batch b.
  Index page(Index b, Index j) const { return table[b * table_stride + j / page_rows]; }
};

/// Everything one attention call needs.
///
/// Shapes: q (B, H, Lq, D), k (B, Hkv, Lk, D), v (B, Hkv, Lk, Dv) (paged: pools, KeyPages); query head h reads
/// key/value head h / (H / Hkv). v may have Dv == 0 when only the weights are wanted. KV is the storage type of k and
/// v: T, or a 16-bit type (bfloat16, float16) that the decode kernel reads in place and widens to T = float, or
/// std::int8_t with a bfloat16 scale per block of 32 (quantized.hpp), which the decode kernel dequantises as it reads.
template <typename T, typename KV = T>
struct AttentionParams {
  TensorView<const T, 4> q;
  TensorView<const KV, 4> k;
  TensorView<const KV, 4> v;
  TensorView<const bfloat16, 4> k_scales;  // KV = std::int8_t: (B, Hkv, Lk, int8_blocks(D)), the scales of k's blocks
  TensorView<const bfloat16, 4> v_scales;  // KV = std::int8_t: (B, Hkv, Lk, int8_blocks(Dv)), the scales of v's blocks
  T scale = T(1);           // s_ij = scale * q_i . k_j (+ the mask's terms)
  T softcap = T(0);         // > 0: s_ij = softcap * tanh(scale * q_i . k_j / softcap) (+ the mask's terms)
  const T* sinks = nullptr;  // one logit per query head joining every row's softmax (softmax.hpp, rule 6), or none
  MaskParams<T> mask;       // which keys a row sees, and what is added to its scores
  DropoutParams<T> dropout;  // which probabilities survive
  KeyPages pages;            // present: k, v (and their scales) are pools of pages, addressed through pages.table

  /// Query head h's sink logit, -inf without sinks (a sink of weight exp(-inf) = 0).
  T sink(Index h) const { return sinks ? sinks[h] : -std::numeric_limits<T>::infinity(); }

  Index batch() const { return q.dim(0); }
  Index heads() const { return q.dim(1); }
  Index kv_heads() const { return k.dim(1); }
  Index group() const { return q.dim(1) / k.dim(1); }  ///< G = H / Hkv query heads per key/value head
  Index q_len() const { return q.dim(2); }
  Index k_len() const { return pages.present() ? pages.keys : k.dim(2); }
  Index head_dim() const { return q.dim(3); }
  Index value_dim() const { return v.dim(3); }
  Index kv_head(Index h) const { return h / group(); }
};

/// Outputs of a forward kernel: out (B, H, Lq, Dv), lse (B, H, Lq), weights (B, H, Lq, Lk) or absent. O is out's
/// element type: T, or the 16-bit type of a 16-bit call, which the fused kernel rounds each finished row to.
template <typename T, typename O = T>
struct ForwardOutputs {
  TensorView<O, 4> out;
  TensorView<T, 3> lse;
  TensorView<T, 4> weights;
};

/// Inputs and outputs of a backward kernel, shapes of the forward's: out, dout (B, H, Lq, Dv), lse (B, H, Lq);
/// dq, dk, dv like q, k, v; dbias like the bias (its broadcast shape), absent without a bias.
template <typename T>
struct BackwardTensors {
  TensorView<const T, 4> out;
  TensorView<const T, 3> lse;
  TensorView<const T, 4> dout;
  TensorView<T, 4> dq;
  TensorView<T, 4> dk;
  TensorView<T, 4> dv;
  TensorView<T, 4> dbias;
};

/// Pointer to element (b, h, l, 0) of a rank-4 view.
template <typename T>
T* row_pointer(const TensorView<T, 4>& x, Index b, Index h, Index l) {
  return x.data() + b * x.stride(0) + h * x.stride(1) + l * x.stride(2);
}

/// Element (b, h, i) of a rank-3 view (lse).
template <typename T>
T& element(const TensorView<T, 3>& x, Index b, Index h, Index i) {
  return x.data()[b * x.stride(0) + h * x.stride(1) + i * x.stride(2)];
}

inline Index ceil_div(Index a, Index b) { return (a + b - 1) / b; }

/// Grows v to at least n entries, never shrinks it: kernel scratch kept between calls (AttentionWorkspace) uses
/// its first n entries, so that a call needing fewer than an earlier one frees and allocates nothing.
template <typename U, typename Allocator>
void grow_to(std::vector<U, Allocator>& v, Index n) {
  if (v.size() < static_cast<std::size_t>(n)) v.resize(static_cast<std::size_t>(n));
}

/// Zeroes a contiguous tensor owned by the caller (gradients before accumulation).
template <typename T>
void set_zero(const TensorView<T, 4>& x) {
  std::fill(x.data(), x.data() + x.size(), T(0));
}

}  // namespace selfattn::detail
