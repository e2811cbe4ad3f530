// selfattn/detail/widen.hpp — packets of float read straight from 16-bit storage, for the kernels that read a
// bfloat16 or float16 KV cache in place (decode_streaming.hpp) or widen it a chunk at a time (decode_grouped.hpp).
//
// A bfloat16 is the upper half of a float: widening is a zero-extension and a 16-bit shift (SSE2: one unpack
// with zeros). A float16 needs the F16C conversion (vcvtph2ps) when the target has it; without F16C (or without
// a vector unit) the lanes are converted one by one through Eigen's scalar conversion. Chosen at compile time
// from the target's macros: the library carries no -march.
#pragma once

#include <selfattn/detail/simd.hpp>
#include <selfattn/half_precision.hpp>

#include <Eigen/Core>

#include <type_traits>

#if defined(EIGEN_VECTORIZE_SSE2)
#include <immintrin.h>
#endif

namespace selfattn::detail::micro {

/// A packet of T holding x[0 .. packet_size<T>), converted exactly from storage type S (a plain unaligned load
/// when S is T). The packet of float is told by its size (16: AVX-512, 8: AVX, 4: SSE) under each target macro.
template <typename T, typename S>
EIGEN_ALWAYS_INLINE Packet<T> load_widened(const S* x) {
  using P = Packet<T>;
  if constexpr (std::is_same_v<S, T>) {
    return Eigen::internal::ploadu<P>(x);
  } else {
    static_assert(std::is_same_v<T, float>, "16-bit storage widens to float");
#if defined(EIGEN_VECTORIZE_AVX512)
    if constexpr (packet_size<T> == 16) {
      const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
      if constexpr (std::is_same_v<S, bfloat16>)
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
      else
        return _mm512_cvtph_ps(raw);
    }
#endif
#if defined(EIGEN_VECTORIZE_AVX2)
    if constexpr (packet_size<T> == 8 && std::is_same_v<S, bfloat16>) {
      const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x));
      return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));
    }
#endif
#if defined(EIGEN_VECTORIZE_AVX) && defined(__F16C__)
    if constexpr (packet_size<T> == 8 && std::is_same_v<S, float16>)
      return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x)));
#endif
#if defined(EIGEN_VECTORIZE_SSE2) && !defined(EIGEN_VECTORIZE_AVX)
    if constexpr (packet_size<T> == 4 && std::is_same_v<S, bfloat16>) {
      const __m128i raw = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(x));
      return _mm_castsi128_ps(_mm_unpacklo_epi16(_mm_setzero_si128(), raw));
    }
#if defined(__F16C__)
    if constexpr (packet_size<T> == 4 && std::is_same_v<S, float16>)
      return _mm_cvtph_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(x)));
#endif
#endif
    // Any other target: lane by lane (the portable path).
    constexpr Index ps = packet_size<T>;
    alignas(64) T lanes[ps];
    for (Index i = 0; i < ps; ++i) lanes[i] = widen<T>(x[i]);
    return Eigen::internal::pload<P>(lanes);
  }
}

/// The (rows, cols) elements of x (row stride ld) converted exactly to T into the contiguous (rows, cols) y, a packet
/// at a time (the decode paths that widen a chunk of a 16-bit cache before their products).
template <typename T, typename S>
void widen_rows(const S* x, Index ld, Index rows, Index cols, T* y) {
  constexpr Index ps = packet_size<T>;
  for (Index r = 0; r < rows; ++r) {
    const S* from = x + r * ld;
    T* to = y + r * cols;
    Index c = 0;
    for (; c + ps <= cols; c += ps) Eigen::internal::pstoreu(to + c, load_widened<T>(from + c));
    for (; c < cols; ++c) to[c] = widen<T>(from[c]);
  }
}

}  // namespace selfattn::detail::micro
