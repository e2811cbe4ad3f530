// selfattn/detail/simd.hpp — the SIMD vocabulary of the fast kernels: packets, aligned scratch memory, unrolled
// loops, a fast exp, a finiteness check and software prefetching.
//
// Everything is written with Eigen's packet math (Eigen::internal::pload / pmadd / pexp ...), so it adapts to
// whatever SIMD the user compiles for (SSE2, AVX2, AVX-512, NEON, or plain scalars) without a single -march
// flag on the library.
#pragma once

#include <selfattn/tensor.hpp>

#include <Eigen/Core>

#include <algorithm>
#include <cstddef>
#include <limits>
#include <new>
#include <type_traits>
#include <utility>
#include <vector>

/// Forces a lambda inline (after its parameter list): an epilogue that is not inlined makes the compiler spill
/// the micro-kernel's accumulators to memory to pass them (measured: 4% of the forward).
#if defined(__GNUC__) || defined(__clang__)
#define SELFATTN_INLINE_LAMBDA __attribute__((always_inline))
#else
#define SELFATTN_INLINE_LAMBDA
#endif

namespace selfattn::detail::micro {

/// The SIMD packet of T under the current compile flags (a scalar when Eigen does not vectorise T).
template <typename T>
using Packet = typename Eigen::internal::packet_traits<T>::type;

/// Lanes of Packet<T>: 16 floats under AVX-512, 8 under AVX2, 4 under SSE2; 1 without vectorisation.
template <typename T>
inline constexpr Index packet_size = Eigen::internal::unpacket_traits<Packet<T>>::size;

/// A cache-line (64-byte) aligned allocator through C++17's aligned operator new, so scratch memory is
/// counted by anything that counts operator new (tests/fused_test.cpp does).
template <typename T>
struct AlignedAllocator {
  using value_type = T;
  static constexpr std::size_t alignment = 64;
  AlignedAllocator() = default;
  template <typename U>
  AlignedAllocator(const AlignedAllocator<U>&) noexcept {}  // NOLINT(google-explicit-constructor): rebinding
  T* allocate(std::size_t n) {
    return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t(alignment)));
  }
  void deallocate(T* pointer, std::size_t) noexcept { ::operator delete(pointer, std::align_val_t(alignment)); }
  template <typename U>
  bool operator==(const AlignedAllocator<U>&) const noexcept { return true; }
  template <typename U>
  bool operator!=(const AlignedAllocator<U>&) const noexcept { return false; }
};

/// 64-byte aligned scratch memory.
template <typename T>
using Buffer = std::vector<T, AlignedAllocator<T>>;

/// f(std::integral_constant<int, 0>{}), ..., f(std::integral_constant<int, N - 1>{}): a loop the compiler
/// cannot fail to unroll, so the accumulators stay in registers.
template <typename F, int... I>
EIGEN_ALWAYS_INLINE void unroll_impl(F& f, std::integer_sequence<int, I...>) {
  (f(std::integral_constant<int, I>{}), ...);
}
template <int N, typename F>
EIGEN_ALWAYS_INLINE void unroll(F&& f) {
  unroll_impl(f, std::make_integer_sequence<int, N>{});
}

/// f(std::true_type{}) when `flag` is set, else f(std::false_type{}): a run-time choice between the two
/// instantiations of a loop whose inner branch must be decided at compile time (the safe products, say).
template <typename F>
EIGEN_ALWAYS_INLINE void with_flag(bool flag, F&& f) {
  if (flag)
    f(std::true_type{});
  else
    f(std::false_type{});
}

/// f(std::integral_constant<int, N>{}, start) over [0, count): tiles of Full, then of 8, 4, 2 and 1, so a
/// ragged end costs a few small tiles and not one instantiation per size.
template <int Full, typename F>
EIGEN_ALWAYS_INLINE void for_each_tile(Index count, F&& f) {
  Index start = 0;
  for (; start + Full <= count; start += Full) f(std::integral_constant<int, Full>{}, start);
  auto smaller = [&](auto size) SELFATTN_INLINE_LAMBDA {
    if constexpr (decltype(size)::value < Full)
      for (; start + decltype(size)::value <= count; start += decltype(size)::value) f(size, start);
  };
  smaller(std::integral_constant<int, 8>{});
  smaller(std::integral_constant<int, 4>{});
  smaller(std::integral_constant<int, 2>{});
  smaller(std::integral_constant<int, 1>{});
}

/// Whether rows x[r * stride + 0 .. n), r < rows, hold no inf and no NaN (x * 0 is NaN exactly for those).
template <typename T>
bool all_finite(const T* x, Index rows, Index n, Index stride) {
  using P = Packet<T>;
  constexpr Index ps = packet_size<T>;
  const P zero = Eigen::internal::pset1<P>(T(0));
  P acc = zero;
  T rest = T(0);
  for (Index r = 0; r < rows; ++r) {
    const T* row = x + r * stride;
    Index i = 0;
    for (; i + ps <= n; i += ps)
      acc = Eigen::internal::padd(acc, Eigen::internal::pmul(Eigen::internal::ploadu<P>(row + i), zero));
    for (; i < n; ++i) rest += row[i] * T(0);
  }
  // The lanes summed through memory, once: no horizontal-reduction intrinsics (GCC 12 warns inside its
  // AVX-512 headers on them, GCC bug 105593).
  T lanes[ps];
  Eigen::internal::pstoreu(lanes, acc);
  for (Index lane = 0; lane < ps; ++lane) rest += lanes[lane];
  return rest == T(0);
}

/// exp(x) for float packets, x <= 0 (x > 88 would overflow): Cody-Waite reduction x = n ln 2 + r, Cephes'
/// polynomial for e^r in Horner form, and 2^n added to the exponent bits. 1.3 ulp at worst on [-87, 0]
/// (Eigen's AVX-512 pexp: 5 ulp near its clamp), about 14 operations (Eigen's: 19). x < -87.3 gives 1.2e-38,
/// not 0: masked entries are selected to 0 by the caller, never computed. NaN stays NaN.
template <typename P>
EIGEN_STRONG_INLINE P exp_float(const P& x0) {
  using namespace Eigen::internal;
  using PI = typename unpacket_traits<P>::integer_packet;
  const P x = pmax(x0, pset1<P>(-87.33654f));  // keeps 2^n a normal number
  const P magic = pset1<P>(12582912.0f);       // 1.5 * 2^23: adding it rounds to an integer
  const P k = pmadd(x, pset1<P>(1.44269504088896341f), magic);
  const P n = psub(k, magic);                         // round(x / ln 2)
  P r = pmadd(n, pset1<P>(-0.693359375f), x);         // x - n ln 2, in two parts
  r = pmadd(n, pset1<P>(2.12194440e-4f), r);
  P y = pset1<P>(1.9875691500e-4f);                   // e^r = 1 + r + r^2 / 2 + ..., |r| <= ln 2 / 2
  y = pmadd(y, r, pset1<P>(1.3981999507e-3f));
  y = pmadd(y, r, pset1<P>(8.3334519073e-3f));
  y = pmadd(y, r, pset1<P>(4.1665795894e-2f));
  y = pmadd(y, r, pset1<P>(1.6666665459e-1f));
  y = pmadd(y, r, pset1<P>(5.0000001201e-1f));
  y = pmadd(y, r, pset1<P>(1.0f));
  y = pmadd(y, r, pset1<P>(1.0f));
  // The low bits of k hold n (k = 1.5 * 2^23 + n): shifted into the exponent field, added to y's: y * 2^n.
  const PI scaled = padd(preinterpret<PI>(y), plogical_shift_left<23>(preinterpret<PI>(k)));
  return pselect(pcmp_eq(x0, x0), preinterpret<P>(scaled), x0);
}

/// exp of a packet of T: exp_float for vectorised float, Eigen's pexp otherwise (double, scalars).
template <typename T>
EIGEN_STRONG_INLINE Packet<T> exp_packet(const Packet<T>& x) {
  if constexpr (std::is_same_v<T, float> && packet_size<T> > 1)
    return exp_float(x);
  else
    return Eigen::internal::pexp(x);
}

/// Prefetches one cache line into L2 (prefetcht1), not L1: the kernels keep their scores and queries there.
EIGEN_ALWAYS_INLINE void prefetch_line(const char* line) {
#if defined(__GNUC__) || defined(__clang__)
  __builtin_prefetch(line, 0, 2);
#else
  Eigen::internal::prefetch(line);
#endif
}

/// Prefetches the lines of one row of `bytes` bytes into L2.
EIGEN_ALWAYS_INLINE void prefetch_row(const void* row, Index bytes) {
  const char* line = static_cast<const char*>(row);
  for (Index offset = 0; offset < bytes; offset += 64) prefetch_line(line + offset);
}

/// The prefetcher of a micro-kernel that prefetches nothing (micro_kernel's default): step() compiles away.
struct NoPrefetch {
  EIGEN_ALWAYS_INLINE void step(Index) {}
};

/// Prefetches the cache lines of rows [first, end) of a matrix (rows ld elements apart, `width` elements each)
/// into L2, in address order, one line every `Period` steps of a micro-kernel's depth loop: spread evenly over a
/// compute loop, the memory traffic for the data a later loop needs overlaps the arithmetic instead of stalling it.
template <typename T, int Period>
class LinePrefetcher {
 public:
  LinePrefetcher() = default;  ///< prefetches nothing
  LinePrefetcher(const T* base, Index ld, Index width, Index first, Index end)
      : row_(reinterpret_cast<const char*>(base + first * ld)),
        row_bytes_(width * static_cast<Index>(sizeof(T))),
        ld_bytes_(ld * static_cast<Index>(sizeof(T))),
        rows_(std::max<Index>(0, end - first)) {}

  EIGEN_ALWAYS_INLINE void step(Index k) {
    if (k % Period == 0) touch();
  }

  EIGEN_ALWAYS_INLINE void touch() {
    if (rows_ == 0) return;
    prefetch_line(row_ + offset_);
    offset_ += line;
    if (offset_ >= row_bytes_) {
      offset_ = 0;
      row_ += ld_bytes_;
      --rows_;
    }
  }

 private:
  static constexpr Index line = 64;
  const char* row_ = nullptr;
  Index row_bytes_ = 0, ld_bytes_ = 0, rows_ = 0, offset_ = 0;
};

}  // namespace selfattn::detail::micro
