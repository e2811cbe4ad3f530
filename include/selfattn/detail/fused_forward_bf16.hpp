// selfattn/detail/fused_forward_bf16.hpp — the fused forward on bfloat16 inputs with both products on the BF16
// dot-product instruction (bf16_dot.hpp): the same blocks, masks, online softmax and outputs as the float kernel
// (kernels/fused_forward.inc's fused_forward_block), with other products.
//
//   S^T = K_tile Q^T   pairs along the head dimension: K's rows are pairs already (packed once per call into
//                      (B, Hkv, Lk, ceil(D / 2)), a copy that pads an odd D with 0), Q^T packed once per block
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

  const micro::Bf16Pair* key_pairs;    // (B, Hkv, Lk, key_row)
  const micro::Bf16Pair* value_pairs;  // (B, Hkv, Dv, value_row)
  Index key_row;                       // ceil(D / 2)
  Index value_row;                     // ceil(Lk / 2)
  Index kv_heads, k_len, value_dim;

  const micro::Bf16Pair* keys_of(Index b, Index hk) const { return key_pairs + (b * kv_heads + hk) * k_len * key_row; }
  const micro::Bf16Pair* values_of(Index b, Index hk) const {
    return value_pairs + (b * kv_heads + hk) * value_dim * value_row;
  }

  void prepare(ForwardWorkspace<float>& w) const {
    w.query_pairs.assign(static_cast<std::size_t>(key_row * lanes), 0);
    w.probability_pairs.assign(static_cast<std::size_t>(isa_avx512::FusedTiles<float>::forward_keys / 2 * lanes), 0);
  }

  /// Q^T as pairs (ceil(D / 2), lanes) of rows [i0, i0 + rows); lanes past the last row stay 0. q holds bfloat16
  /// values widened exactly, so converting back is exact.
  void load_queries(const AttentionParams<float, bfloat16>& p, Index b, Index h, Index i0, Index rows,
                    ForwardWorkspace<float>& w) const {
    const Index head_dim = p.q.dim(3);
    micro::Bf16Pair* qt = w.query_pairs.data();
    std::fill(w.query_pairs.begin(), w.query_pairs.end(), 0);
    const float* q = row_pointer(p.q, b, h, i0);
    for (Index i = 0; i < rows; ++i) {
      const float* row = q + i * p.q.stride(2);
      for (Index pair = 0; pair < key_row; ++pair) {
        const Index d = 2 * pair;
        qt[pair * lanes + i] = micro::make_pair(bfloat16(row[d]), d + 1 < head_dim ? bfloat16(row[d + 1]) : bfloat16(0.0f));
      }
    }
  }

  /// epilogue(m0, acc) over S^T (width, lanes) = K_tile Q^T, keys [j0, j0 + width) of key/value head (b, hk).
  template <typename Epilogue>
  void scores(const AttentionParams<float, bfloat16>&, Index b, Index hk, Index j0, Index width,
              ForwardWorkspace<float>& w, Epilogue& epilogue) const {
    micro::bf16_gemm_panel<micro::micro_packets>(width, key_row, keys_of(b, hk) + j0 * key_row, key_row,
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

/// Packs K and V of every (batch, key/value head) into scratch's pairs (the layouts of Bf16Products). Returns
/// false, with the packing unfinished, when V holds an inf or NaN (the caller then runs the float kernel).
inline bool pack_bf16_pairs(const AttentionParams<float, bfloat16>& p, FusedForwardScratch<float>& scratch,
                            Bf16Products& products) {
  const Index heads = p.batch() * p.kv_heads(), k_len = p.k_len(), head_dim = p.head_dim(), value_dim = p.value_dim();
  products = Bf16Products{nullptr, nullptr, (head_dim + 1) / 2, (k_len + 1) / 2, p.kv_heads(), k_len, value_dim};
  grow_to(scratch.key_pairs, heads * k_len * products.key_row);
  grow_to(scratch.value_pairs, heads * value_dim * products.value_row);
  products.key_pairs = scratch.key_pairs.data();
  products.value_pairs = scratch.value_pairs.data();
  const double work = static_cast<double>(heads * k_len) * static_cast<double>(head_dim + value_dim);
  [[maybe_unused]] const int threads = threads_for(work, heads);
  int finite = 1;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1) reduction(&& : finite)
#endif
  for (Index head = 0; head < heads; ++head) {
    const Index b = head / p.kv_heads(), hk = head % p.kv_heads();
    micro::Bf16Pair* keys = scratch.key_pairs.data() + head * k_len * products.key_row;
    micro::Bf16Pair* values = scratch.value_pairs.data() + head * value_dim * products.value_row;
    std::uint32_t exponents = 0;  // all exponent bits set: inf or NaN
    for (Index j = 0; j < k_len; ++j) {
      const bfloat16* key = row_pointer(p.k, b, hk, j);
      for (Index pair = 0; pair < products.key_row; ++pair)
        keys[j * products.key_row + pair] = micro::load_pair(key + 2 * pair, head_dim - 2 * pair);
    }
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

/// The fused forward on bfloat16 keys and values (q widened, exactly) with the BF16 dot-product products. Returns
/// false, having written nothing, when the values hold an inf or NaN: the caller runs the float kernel.
inline bool fused_forward_bf16(const AttentionParams<float, bfloat16>& p, const ForwardOutputs<float>& result,
                               FusedForwardScratch<float>& scratch) {
  Bf16Products products{};
  if (!pack_bf16_pairs(p, scratch, products)) return false;
  isa_avx512::fused_forward_blocks(p, result, scratch, products);
  return true;
}

}  // namespace selfattn::detail::isa_avx512_bf16
SELFATTN_VECTOR_WARNINGS_ON
SELFATTN_TARGET_END
#endif  // SELFATTN_BF16_DOT
