// selfattn/detail/packets_avx512.hpp — the float packets of the AVX-512 kernels (16 lanes), under the names and with
// the results of Eigen's packet functions (Eigen::internal::pset1, pmadd, ...): the kernels' text, written once,
// compiles against either (kernels.hpp). Each function here is the instruction Eigen 3.4 uses for Packet16f under
// -mavx512f -mavx512dq, so the AVX-512 kernels give bitwise what the generic kernels give in such a build.
#pragma once

#include <selfattn/detail/isa_target.hpp>

#if SELFATTN_DISPATCH_X86
#include <immintrin.h>

#include <type_traits>

SELFATTN_TARGET_BEGIN(SELFATTN_ISA_FEATURES_AVX512)
SELFATTN_VECTOR_WARNINGS_OFF

namespace selfattn::detail::packets_avx512 {

inline constexpr int registers = 32;

// Every mask of 16 lanes set. The intrinsics below that would pass _mm512_undefined_*() through (max, min, the shift,
// the casts to 128 and 256 bits) are written in a form that does not: zero-masking under this mask, extracts of part
// 0, _mm512_cvtss_f32. The same results, without GCC 12's -Wmaybe-uninitialized on the self-initialised undefined value
// once inlined into a kernel (GCC bug 105593), which diagnostic pragmas around the kernels do not silence.
inline constexpr __mmask16 all_lanes = static_cast<__mmask16>(0xffff);

template <typename T>
struct packet_traits {
  using type = T;  // only float has packets here: the dispatched kernels are the float ones
};
template <>
struct packet_traits<float> {
  using type = __m512;
};

template <typename P>
struct unpacket_traits {
  static constexpr int size = 1;
};
template <>
struct unpacket_traits<__m512> {
  static constexpr int size = 16;
  using integer_packet = __m512i;
};

template <typename P>
inline P pset1(const float& a) {
  static_assert(std::is_same_v<P, __m512>, "AVX-512 packets hold float");
  return _mm512_set1_ps(a);
}
template <typename P>
inline P plset(const float& a) {
  static_assert(std::is_same_v<P, __m512>, "AVX-512 packets hold float");
  return _mm512_add_ps(_mm512_set1_ps(a), _mm512_set_ps(15.0f, 14.0f, 13.0f, 12.0f, 11.0f, 10.0f, 9.0f, 8.0f, 7.0f,
                                                        6.0f, 5.0f, 4.0f, 3.0f, 2.0f, 1.0f, 0.0f));
}
template <typename P>
inline P ploadu(const float* from) {
  static_assert(std::is_same_v<P, __m512>, "AVX-512 packets hold float");
  return _mm512_loadu_ps(from);
}
template <typename P>
inline P pload(const float* from) {
  static_assert(std::is_same_v<P, __m512>, "AVX-512 packets hold float");
  return _mm512_load_ps(from);
}
inline void pstoreu(float* to, const __m512& from) { _mm512_storeu_ps(to, from); }
inline void pstore(float* to, const __m512& from) { _mm512_store_ps(to, from); }

inline __m512 padd(const __m512& a, const __m512& b) { return _mm512_add_ps(a, b); }
inline __m512i padd(const __m512i& a, const __m512i& b) { return _mm512_add_epi32(a, b); }
inline __m512 psub(const __m512& a, const __m512& b) { return _mm512_sub_ps(a, b); }
inline __m512 pmul(const __m512& a, const __m512& b) { return _mm512_mul_ps(a, b); }
inline __m512 pdiv(const __m512& a, const __m512& b) { return _mm512_div_ps(a, b); }
inline __m512 pmadd(const __m512& a, const __m512& b, const __m512& c) { return _mm512_fmadd_ps(a, b, c); }
// Arguments swapped as Eigen swaps them, for std::max's NaN behaviour.
inline __m512 pmax(const __m512& a, const __m512& b) { return _mm512_maskz_max_ps(all_lanes, b, a); }
inline __m512 pmin(const __m512& a, const __m512& b) { return _mm512_maskz_min_ps(all_lanes, b, a); }
inline __m512 pabs(const __m512& a) {
  return _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(a), _mm512_set1_epi32(0x7fffffff)));
}
inline __m512 pand(const __m512& a, const __m512& b) { return _mm512_and_ps(a, b); }
inline __m512 por(const __m512& a, const __m512& b) { return _mm512_or_ps(a, b); }
/// Comparisons give Eigen's masks: lanes of all ones or all zeros, as floats.
inline __m512 mask_to_packet(__mmask16 mask) {
  return _mm512_castsi512_ps(_mm512_mask_set1_epi32(_mm512_set1_epi32(0), mask, static_cast<int>(0xffffffffu)));
}
inline __m512 pcmp_eq(const __m512& a, const __m512& b) { return mask_to_packet(_mm512_cmp_ps_mask(a, b, _CMP_EQ_OQ)); }
inline __m512 pcmp_lt(const __m512& a, const __m512& b) { return mask_to_packet(_mm512_cmp_ps_mask(a, b, _CMP_LT_OQ)); }
inline __m512 pcmp_le(const __m512& a, const __m512& b) { return mask_to_packet(_mm512_cmp_ps_mask(a, b, _CMP_LE_OQ)); }
/// mask ? a : b, lane by lane (mask lanes all ones or all zeros).
inline __m512 pselect(const __m512& mask, const __m512& a, const __m512& b) {
  const __mmask16 zero = _mm512_cmp_epi32_mask(_mm512_castps_si512(mask), _mm512_setzero_si512(), _MM_CMPINT_EQ);
  return _mm512_mask_blend_ps(zero, a, b);
}
inline float pfirst(const __m512& a) { return _mm512_cvtss_f32(a); }
inline float predux(const __m512& a) {
  // Eigen's order under AVX512DQ: the two 256-bit halves added, then Packet8f's predux.
  const __m256 half = _mm256_add_ps(_mm512_extractf32x8_ps(a, 0), _mm512_extractf32x8_ps(a, 1));
  const __m128 quarter = _mm_add_ps(_mm256_castps256_ps128(half), _mm256_extractf128_ps(half, 1));
  const __m128 pair = _mm_add_ps(quarter, _mm_movehl_ps(quarter, quarter));
  return _mm_cvtss_f32(_mm_add_ss(pair, _mm_shuffle_ps(pair, pair, 1)));
}

template <typename Target, typename Source>
inline Target preinterpret(const Source& a) {
  if constexpr (std::is_same_v<Target, __m512i> && std::is_same_v<Source, __m512>)
    return _mm512_castps_si512(a);
  else if constexpr (std::is_same_v<Target, __m512> && std::is_same_v<Source, __m512i>)
    return _mm512_castsi512_ps(a);
  else
    static_assert(std::is_same_v<Target, Source>, "preinterpret between float and int32 packets only");
}
template <int N>
inline __m512i plogical_shift_left(const __m512i& a) {
  return _mm512_maskz_slli_epi32(all_lanes, a, N);
}
/// Declared only, for the text of double kernels that the dispatched levels never instantiate.
template <typename P>
P pexp(const P& a);

}  // namespace selfattn::detail::packets_avx512

SELFATTN_VECTOR_WARNINGS_ON
SELFATTN_TARGET_END

#endif
