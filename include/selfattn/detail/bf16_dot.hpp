// selfattn/detail/bf16_dot.hpp — products of bfloat16 operands on the AVX-512 BF16 dot-product instruction, for
// the fused forward on bfloat16 inputs (fused_forward_bf16.hpp).
//
// vdpbf16ps (_mm512_dpbf16_ps) takes two vectors of 32 bfloat16 and adds to each of 16 float lanes
//   acc_i += a_2i * b_2i + a_2i+1 * b_2i+1
// so its operands are pairs: a 32-bit word holding the bfloat16 of depth index 2p (low half) and 2p + 1 (high
// half). The products are exact in float (8-bit significands); the sums are float's, as in a float kernel.
// Unlike float arithmetic the instructions treat subnormal inputs (|x| < 2^-126) as 0 and flush subnormal results to
// 0, the conversion of probabilities to bfloat16 included.
//
// The micro-kernel is the float one (kernels/microkernels.inc) with depth counted in pairs: A's pairs broadcast to every
// lane, B's read as packets of 16 pairs, MR x NV float accumulators in registers, an epilogue per block of rows.
// One pair-step does the multiply-adds of two float steps in one instruction: twice the arithmetic rate of FMA.
//
// Compiled for the avx512_bf16 level whatever the translation unit's flags, in a namespace of its own
// (isa_avx512_bf16, beside kernels.hpp's levels), on g++ and clang++ for x86-64 (SELFATTN_DISPATCH_X86), unless the
// user defines SELFATTN_NO_BF16_DOT. Whether it runs is decided at run time (dispatch.hpp, bfloat16_products()).
#pragma once

#include <selfattn/detail/kernels.hpp>
#include <selfattn/detail/simd.hpp>
#include <selfattn/half_precision.hpp>
#include <selfattn/tensor.hpp>

#include <Eigen/Core>

#include <cstdint>
#include <cstring>

#if SELFATTN_DISPATCH_X86 && !defined(SELFATTN_NO_BF16_DOT)
#define SELFATTN_BF16_DOT 1
#include <immintrin.h>
#else
#define SELFATTN_BF16_DOT 0
#endif

namespace selfattn::detail::micro {

/// Whether this build carries the BF16 dot-product products (see the file comment); whether they run is
/// bfloat16_products()'s call.
inline constexpr bool has_bf16_dot = SELFATTN_BF16_DOT != 0;

/// Two bfloat16 of consecutive depth indices: the first in the low 16 bits, the second in the high 16.
using Bf16Pair = std::uint32_t;

/// The bits of a bfloat16.
inline std::uint32_t bf16_bits(bfloat16 x) {
  std::uint16_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  return bits;
}

/// The pair (first, second).
inline Bf16Pair make_pair(bfloat16 first, bfloat16 second) { return bf16_bits(first) | bf16_bits(second) << 16; }

/// The pair of x[0], x[1], or of x[0] and 0 when only one element is left (`count` == 1).
inline Bf16Pair load_pair(const bfloat16* x, Index count) {
  return make_pair(x[0], count > 1 ? x[1] : bfloat16(0.0f));
}

}  // namespace selfattn::detail::micro

#if SELFATTN_BF16_DOT
SELFATTN_TARGET_BEGIN(SELFATTN_ISA_FEATURES_AVX512_BF16)
SELFATTN_VECTOR_WARNINGS_OFF
// The avx512_bf16 level: the avx512 level's packets, its tiles and float kernels (isa_avx512), and these products.
namespace selfattn::detail::isa_avx512_bf16 {
namespace vec = ::selfattn::detail::packets_avx512;
#include <selfattn/detail/kernels/vocabulary.inc>

namespace micro {
using ::selfattn::detail::micro::Bf16Pair;
using ::selfattn::detail::micro::load_pair;
using ::selfattn::detail::micro::make_pair;
inline constexpr int micro_rows = isa_avx512::micro::micro_rows;
inline constexpr int micro_packets = isa_avx512::micro::micro_packets;

/// The MR x NV micro-kernel in pairs: acc[m][v] = sum_p A(m, p) . B(p, v-th packet of 16 pairs), with
/// A(m, p) = a[m * ams + p] (one pair, broadcast) and B's row p at b + p * ldb.
template <int MR, int NV>
EIGEN_ALWAYS_INLINE void bf16_micro_kernel(Index depth, const Bf16Pair* a, Index ams, const Bf16Pair* b, Index ldb,
                                           __m512 (&result)[MR][NV]) {
  __m512 acc[MR][NV];
  unroll<MR>([&](auto m) { unroll<NV>([&](auto v) { acc[m][v] = _mm512_setzero_ps(); }); });
  for (Index p = 0; p < depth; ++p) {
    __m512bh bv[NV];
    unroll<NV>([&](auto v) { bv[v] = (__m512bh)_mm512_loadu_si512(b + p * ldb + v * 16); });
    unroll<MR>([&](auto m) {
      // Copied, not dereferenced: a may point into bfloat16 storage read in place (a key tensor whose rows are
      // pairs already), which no uint32_t lvalue may read.
      Bf16Pair pair;
      std::memcpy(&pair, a + m * ams + p, sizeof pair);
      const __m512bh av = (__m512bh)_mm512_set1_epi32(static_cast<int>(pair));
      unroll<NV>([&](auto v) { acc[m][v] = _mm512_dpbf16_ps(acc[m][v], av, bv[v]); });
    });
  }
  unroll<MR>([&](auto m) { unroll<NV>([&](auto v) { result[m][v] = acc[m][v]; }); });
}

/// The rows left after the full blocks of micro_rows: one block of R = rest rows.
template <int NV, int R, typename Epilogue>
void bf16_rows_tail(Index m0, Index rest, Index depth, const Bf16Pair* a, Index ams, const Bf16Pair* b, Index ldb,
                    Epilogue& epilogue) {
  if constexpr (R >= 1) {
    if (rest == R) {
      __m512 acc[R][NV];
      bf16_micro_kernel<R, NV>(depth, a + m0 * ams, ams, b, ldb, acc);
      epilogue(m0, acc);
    } else {
      bf16_rows_tail<NV, R - 1>(m0, rest, depth, a, ams, b, ldb, epilogue);
    }
  }
}

/// The micro-kernel over rows [0, rows): epilogue(m0, acc) with acc a __m512[R][NV] for rows m0 .. m0 + R - 1
/// (gemm_panel's contract, depth in pairs).
template <int NV, typename Epilogue>
void bf16_gemm_panel(Index rows, Index depth, const Bf16Pair* a, Index ams, const Bf16Pair* b, Index ldb,
                     Epilogue& epilogue) {
  constexpr int MR = micro_rows;
  Index m0 = 0;
  for (; m0 + MR <= rows; m0 += MR) {
    __m512 acc[MR][NV];
    bf16_micro_kernel<MR, NV>(depth, a + m0 * ams, ams, b, ldb, acc);
    epilogue(m0, acc);
  }
  if (m0 < rows) bf16_rows_tail<NV, MR - 1>(m0, rows - m0, depth, a, ams, b, ldb, epilogue);
}

/// 16 pairs (first[i], second[i]) of two packets of float, each rounded to the nearest bfloat16 (ties to even; a
/// subnormal float becomes a zero of its sign, as the instruction does).
EIGEN_ALWAYS_INLINE __m512i round_to_pairs(__m512 first, __m512 second) {
  // cvtne2ps puts `second` rounded in the upper 16 words and `first` in the lower; the permutation interleaves them.
  const __m512i halves = (__m512i)_mm512_cvtne2ps_pbh(second, first);
  const __m512i interleave = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7,
                                              22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  return _mm512_permutexvar_epi16(interleave, halves);
}

}  // namespace micro
}  // namespace selfattn::detail::isa_avx512_bf16
SELFATTN_VECTOR_WARNINGS_ON
SELFATTN_TARGET_END
#endif  // SELFATTN_BF16_DOT
