// selfattn/detail/fused_forward_bf16.hpp — the fused forward on bfloat16 inputs with both products on the BF16
// dot-product instruction (bf16_dot.hpp): the same blocks, masks, online softmax and outputs as the float kernel
// (kernels/fused_forward.inc's fused_forward_block), with other products.
//
//   S^T = K_tile Q^T   pairs along the head dimension: K's rows are pairs already (read in place; with an odd D
//                      or odd strides, packed once per call into (B, Hkv, Lk, ceil(D / 2)), an odd D padded with
//                      0), Q^T packed once per block from the bfloat16 q
//   O^T += V^T P^T     pairs along the keys: V transposed into (B, Hkv, Dv, ceil(Lk / 2)) once per call, and each
//                      tile's probabilities P^T rounded to bfloat16 pairs (FlashAttention does the same with its
//                      16-bit P); the running sums l_i are of the float probabilities, as are lse and the weights
//
// Scores, softmax, sums and the output before its final rounding stay float. Tiles start at even keys (pairs
// never straddle a tile). Values holding inf or NaN take the float kernel instead (its products skip zero factors,
// so a masked key's NaN never reaches an output); the pairs' packing finds them.
//
// The avx512_bf16 level (bf16_dot.hpp): these products compiled for it, driving the avx512 level's blocks
// (isa_avx512::fused_forward_blocks); the blocks call the products per tile, across the two targets.
#pragma once

#include <selfattn/detail/bf16_dot.hpp>
#include <selfattn/detail/dispatch.hpp>
#include <selfattn/detail/params.hpp>
#include <selfattn/detail/threads.hpp>
#include <selfattn/half_precision.hpp>
#include <selfattn/tensor.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#if SELFATTN_BF16_DOT
SELFATTN_TARGET_BEGIN(SELFATTN_ISA_FEATURES_AVX512_BF16)
SELFATTN_VECTOR_WARNINGS_OFF
namespace selfattn::detail::isa_avx512_bf16 {

/// The products of fused_forward_block on bfloat16 pairs (see the file comment).
struct Bf16Products {
  static constexpr Index lanes = isa_avx512::FusedTiles<float>::lanes;
  /// Tiles start at even keys, so that the pairs of V^T and P^T never straddle two tiles.
  static constexpr Index key_alignment = 2;

  TensorView<const bfloat16, 4> query;  // the call's q, read a block at a time (p.q gives only its shape)
  const micro::Bf16Pair* key_pairs;     // key (b, hk, j) at b * key_batch + hk * key_head + j * key_stride
  Index key_batch, key_head, key_stride;
  Index key_row;                        // ceil(D / 2) pairs per key
  const micro::Bf16Pair* value_pairs;   // (B, Hkv, Dv, value_row)
  Index value_row;                      // ceil(Lk / 2)
  Index kv_heads, value_dim;

  const micro::Bf16Pair* keys_of(Index b, Index hk) const { return key_pairs + b * key_batch + hk * key_head; }
  const micro::Bf16Pair* values_of(Index b, Index hk) const {
    return value_pairs + (b * kv_heads + hk) * value_dim * value_row;
  }

  void prepare(ForwardWorkspace<float>& w) const {
    w.query_pairs.assign(static_cast<std::size_t>(key_row * lanes), 0);
    w.probability_pairs.assign(static_cast<std::size_t>(isa_avx512::FusedTiles<float>::forward_keys / 2 * lanes), 0);
  }

  /// Q^T as pairs (ceil(D / 2), lanes) of rows [i0, i0 + rows), from the bfloat16 q as it is; lanes past the last
  /// row stay 0.
  void load_queries(const AttentionParams<float, bfloat16>& p, Index b, Index h, Index i0, Index rows,
                    ForwardWorkspace<float>& w) const {
    const Index head_dim = p.head_dim();
    micro::Bf16Pair* qt = w.query_pairs.data();
    std::fill(w.query_pairs.begin(), w.query_pairs.end(), 0);
    const bfloat16* q = row_pointer(query, b, h, i0);
    for (Index i = 0; i < rows; ++i) {
      const bfloat16* row = q + i * query.stride(2);
      for (Index pair = 0; pair < key_row; ++pair) qt[pair * lanes + i] = micro::load_pair(row + 2 * pair, head_dim - 2 * pair);
    }
  }

  /// epilogue(m0, acc) over S^T (width, lanes) = K_tile Q^T, keys [j0, j0 + width) of key/value head (b, hk).
  template <typename Epilogue>
  void scores(const AttentionParams<float, bfloat16>&, Index b, Index hk, Index j0, Index width,
              ForwardWorkspace<float>& w, Epilogue& epilogue) const {
    micro::bf16_gemm_panel<micro::micro_packets>(width, key_row, keys_of(b, hk) + j0 * key_stride, key_stride,
                                                 w.query_pairs.data(), lanes, epilogue);
  }

  /// epilogue(m0, acc) over V_tile^T P^T (Dv, lanes): P^T (in w.s, float) rounded to pairs of keys first.
  template <typename Epilogue>
  void values(const AttentionParams<float, bfloat16>&, Index b, Index hk, Index j0, Index width,
              ForwardWorkspace<float>& w, Epilogue& epilogue) const {
    const Index pairs = (width + 1) / 2;
    const float* s = w.s.data();
    micro::Bf16Pair* pt = w.probability_pairs.data();
    for (Index pair = 0; pair < pairs; ++pair) {
      const float* first = s + 2 * pair * lanes;
      const bool odd_end = 2 * pair + 1 == width;  // the tile's last key has no partner: pair it with 0
      for (Index c = 0; c < lanes; c += 16) {
        const __m512 second = odd_end ? _mm512_setzero_ps() : _mm512_loadu_ps(first + lanes + c);
        _mm512_storeu_si512(pt + pair * lanes + c, micro::round_to_pairs(_mm512_loadu_ps(first + c), second));
      }
    }
    micro::bf16_gemm_panel<micro::micro_packets>(value_dim, pairs, values_of(b, hk) + j0 / 2, value_row, pt, lanes,
                                                 epilogue);
  }
};

/// Whether k's rows are pairs already, to be read in place: an even D, every stride even (each row starts a pair)
/// and the data on a 4-byte boundary.
inline bool keys_are_pairs(const TensorView<const bfloat16, 4>& k) {
  const auto address = reinterpret_cast<std::uintptr_t>(k.data());
  return k.dim(3) % 2 == 0 && k.stride(0) % 2 == 0 && k.stride(1) % 2 == 0 && k.stride(2) % 2 == 0 &&
         address % sizeof(micro::Bf16Pair) == 0;
}

/// Points products at the keys as pairs: k itself when its rows are pairs already (keys_are_pairs), else a copy in
/// scratch, (B, Hkv, Lk, ceil(D / 2)), an odd D padded with 0.
inline void key_pairs_of(const AttentionParams<float, bfloat16>& p, FusedForwardScratch<float>& scratch,
                         Bf16Products& products) {
  const Index k_len = p.k_len(), head_dim = p.head_dim(), row = products.key_row;
  if (keys_are_pairs(p.k)) {
    products.key_pairs = reinterpret_cast<const micro::Bf16Pair*>(p.k.data());
    products.key_batch = p.k.stride(0) / 2;
    products.key_head = p.k.stride(1) / 2;
    products.key_stride = p.k.stride(2) / 2;
    return;
  }
  const Index heads = p.batch() * p.kv_heads();
  grow_to(scratch.key_pairs, heads * k_len * row);
  products.key_pairs = scratch.key_pairs.data();
  products.key_batch = p.kv_heads() * k_len * row;
  products.key_head = k_len * row;
  products.key_stride = row;
  [[maybe_unused]] const int threads = threads_for(static_cast<double>(heads * k_len * head_dim), heads);
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
#endif
  for (Index head = 0; head < heads; ++head) {
    micro::Bf16Pair* keys = scratch.key_pairs.data() + head * k_len * row;
    for (Index j = 0; j < k_len; ++j) {
      const bfloat16* key = row_pointer(p.k, head / p.kv_heads(), head % p.kv_heads(), j);
      for (Index pair = 0; pair < row; ++pair) keys[j * row + pair] = micro::load_pair(key + 2 * pair, head_dim - 2 * pair);
    }
  }
}

/// Packs V of every (batch, key/value head) transposed into scratch's pairs (Bf16Products' layout). Returns false,
/// with the packing unfinished, when V holds an inf or NaN (the caller then runs the float kernel).
inline bool value_pairs_of(const AttentionParams<float, bfloat16>& p, FusedForwardScratch<float>& scratch,
                           Bf16Products& products) {
  const Index heads = p.batch() * p.kv_heads(), k_len = p.k_len(), value_dim = p.value_dim();
  grow_to(scratch.value_pairs, heads * value_dim * products.value_row);
  products.value_pairs = scratch.value_pairs.data();
  [[maybe_unused]] const int threads = threads_for(static_cast<double>(heads * k_len * value_dim), heads);
  int finite = 1;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1) reduction(&& : finite)
#endif
  for (Index head = 0; head < heads; ++head) {
    const Index b = head / p.kv_heads(), hk = head % p.kv_heads();
    micro::Bf16Pair* values = scratch.value_pairs.data() + head * value_dim * products.value_row;
    std::uint32_t exponents = 0;  // all exponent bits set: inf or NaN
    for (Index pair = 0; pair < products.value_row; ++pair) {
      const bfloat16* first = row_pointer(p.v, b, hk, 2 * pair);
      const bfloat16* second = 2 * pair + 1 < k_len ? first + p.v.stride(2) : nullptr;
      for (Index d = 0; d < value_dim; ++d) {
        const micro::Bf16Pair both = micro::make_pair(first[d], second ? second[d] : bfloat16(0.0f));
        values[d * products.value_row + pair] = both;
        const std::uint32_t a = both & 0x7F80u, c = both & 0x7F800000u;
        exponents |= static_cast<std::uint32_t>(a == 0x7F80u) | static_cast<std::uint32_t>(c == 0x7F800000u);
      }
    }
    finite = finite && exponents == 0;
  }
  return finite != 0;
}

/// The fused forward on bfloat16 q, k, v with the BF16 dot-product products, out rounded to bfloat16 row by row:
/// no float copy of q or out. p.q gives q's shape only (its data may be null); `query` holds the queries. Returns
/// false, having written nothing, when the values hold an inf or NaN: the caller runs the float kernel.
inline bool fused_forward_bf16(const AttentionParams<float, bfloat16>& p, const TensorView<const bfloat16, 4>& query,
                               const ForwardOutputs<float, bfloat16>& result, FusedForwardScratch<float>& scratch) {
  Bf16Products products{};
  products.query = query;
  products.key_row = (p.head_dim() + 1) / 2;
  products.value_row = (p.k_len() + 1) / 2;
  products.kv_heads = p.kv_heads();
  products.value_dim = p.value_dim();
  if (!value_pairs_of(p, scratch, products)) return false;
  key_pairs_of(p, scratch, products);
  isa_avx512::fused_forward_blocks(p, result, scratch, products);
  return true;
}

}  // namespace selfattn::detail::isa_avx512_bf16
SELFATTN_VECTOR_WARNINGS_ON
SELFATTN_TARGET_END
#endif  // SELFATTN_BF16_DOT
