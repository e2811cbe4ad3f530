// selfattn/detail/packets_avx2.hpp — the float packets of the AVX2 kernels (8 lanes, FMA), under the names and with
// the results of Eigen's packet functions (Eigen::internal::pset1, pmadd, ...): the kernels' text, written once,
// compiles against either (kernels.hpp). Each function here is the instruction Eigen 3.4 uses for Packet8f under
// -mavx2 -mfma, so the AVX2 kernels give bitwise what the generic kernels give in such a build.
#pragma once

#include <selfattn/detail/isa_target.hpp>

#if SELFATTN_DISPATCH_X86
#include <immintrin.h>

#include <type_traits>

SELFATTN_TARGET_BEGIN(SELFATTN_ISA_FEATURES_AVX2)
SELFATTN_VECTOR_WARNINGS_OFF

namespace selfattn::detail::packets_avx2 {

inline constexpr int registers = 16;

template <typename T>
struct packet_traits {
  using type = T;  // only float has packets here: the dispatched kernels are the float ones
};
template <>
struct packet_traits<float> {
  using type = __m256;
};

template <typename P>
struct unpacket_traits {
  static constexpr int size = 1;
};
template <>
struct unpacket_traits<__m256> {
  static constexpr int size = 8;
  using integer_packet = __m256i;
};

template <typename P>
inline P pset1(const float& a) {
  static_assert(std::is_same_v<P, __m256>, "AVX2 packets hold float");
  return _mm256_set1_ps(a);
}
template <typename P>
inline P plset(const float& a) {
  static_assert(std::is_same_v<P, __m256>, "AVX2 packets hold float");
  return _mm256_add_ps(_mm256_set1_ps(a), _mm256_set_ps(7.0f, 6.0f, 5.0f, 4.0f, 3.0f, 2.0f, 1.0f, 0.0f));
}
template <typename P>
inline P ploadu(const float* from) {
  static_assert(std::is_same_v<P, __m256>, "AVX2 packets hold float");
  return _mm256_loadu_ps(from);
}
template <typename P>
inline P pload(const float* from) {
  static_assert(std::is_same_v<P, __m256>, "AVX2 packets hold float");
  return _mm256_load_ps(from);
}
inline void pstoreu(float* to, const __m256& from) { _mm256_storeu_ps(to, from); }
inline void pstore(float* to, const __m256& from) { _mm256_store_ps(to, from); }

inline __m256 padd(const __m256& a, const __m256& b) { return _mm256_add_ps(a, b); }
inline __m256i padd(const __m256i& a, const __m256i& b) { return _mm256_add_epi32(a, b); }
inline __m256 psub(const __m256& a, const __m256& b) { return _mm256_sub_ps(a, b); }
inline __m256 pmul(const __m256& a, const __m256& b) { return _mm256_mul_ps(a, b); }
inline __m256 pdiv(const __m256& a, const __m256& b) { return _mm256_div_ps(a, b); }
inline __m256 pmadd(const __m256& a, const __m256& b, const __m256& c) { return _mm256_fmadd_ps(a, b, c); }
// Arguments swapped as Eigen swaps them (std::max's NaN behaviour): max(a, NaN) = a... as vmaxps(b, a) gives.
inline __m256 pmax(const __m256& a, const __m256& b) { return _mm256_max_ps(b, a); }
inline __m256 pmin(const __m256& a, const __m256& b) { return _mm256_min_ps(b, a); }
inline __m256 pabs(const __m256& a) { return _mm256_and_ps(a, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff))); }
inline __m256 pand(const __m256& a, const __m256& b) { return _mm256_and_ps(a, b); }
inline __m256 por(const __m256& a, const __m256& b) { return _mm256_or_ps(a, b); }
inline __m256 pcmp_eq(const __m256& a, const __m256& b) { return _mm256_cmp_ps(a, b, _CMP_EQ_OQ); }
inline __m256 pcmp_lt(const __m256& a, const __m256& b) { return _mm256_cmp_ps(a, b, _CMP_LT_OQ); }
inline __m256 pcmp_le(const __m256& a, const __m256& b) { return _mm256_cmp_ps(a, b, _CMP_LE_OQ); }
/// mask ? a : b, lane by lane (mask lanes all ones or all zeros).
inline __m256 pselect(const __m256& mask, const __m256& a, const __m256& b) { return _mm256_blendv_ps(b, a, mask); }
inline float pfirst(const __m256& a) { return _mm_cvtss_f32(_mm256_castps256_ps128(a)); }
inline float predux(const __m256& a) {
  // Eigen's order: the two halves added, then Packet4f's predux (high pair onto low pair, then lane 1 onto 0).
  const __m128 half = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  const __m128 pair = _mm_add_ps(half, _mm_movehl_ps(half, half));
  return _mm_cvtss_f32(_mm_add_ss(pair, _mm_shuffle_ps(pair, pair, 1)));
}

template <typename Target, typename Source>
inline Target preinterpret(const Source& a) {
  if constexpr (std::is_same_v<Target, __m256i> && std::is_same_v<Source, __m256>)
    return _mm256_castps_si256(a);
  else if constexpr (std::is_same_v<Target, __m256> && std::is_same_v<Source, __m256i>)
    return _mm256_castsi256_ps(a);
  else
    static_assert(std::is_same_v<Target, Source>, "preinterpret between float and int32 packets only");
}
template <int N>
inline __m256i plogical_shift_left(const __m256i& a) {
  return _mm256_slli_epi32(a, N);
}
/// Declared only, for the text of double kernels that the dispatched levels never instantiate.
template <typename P>
P pexp(const P& a);

}  // namespace selfattn::detail::packets_avx2

SELFATTN_VECTOR_WARNINGS_ON
SELFATTN_TARGET_END

#endif
