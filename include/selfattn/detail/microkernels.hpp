// selfattn/detail/microkernels.hpp — the register-blocked inner loops of the fused attention kernel.
//
// Everything here is written with Eigen's packet math (Eigen::internal::pload / pmadd / pexp ...), so it
// adapts to whatever SIMD the user compiles for (SSE2, AVX2, AVX-512, NEON, or plain scalars) without a
// single -march flag on the library. Three building blocks:
//
//   gemm_panel      C[M x NV packets] = A[M x K] . B[K x NV packets], A read element by element (broadcast,
//                   any strides: a row-major, a transposed or a strided head view all work without a copy),
//                   B read as packets from rows ldb apart. The accumulators of an MR x NV micro-tile stay
//                   in registers for the whole K loop; an epilogue functor receives them and decides what
//                   to do (store, accumulate, rescale and accumulate, ...).
//   exp_or_zero     P = s == -inf ? 0 : exp(s - m), the exponential vectorised and the masked entries
//                   *selected* to 0 (Eigen's vectorised exp(-inf) is 2.9e-39, not 0: PITFALLS.md).
//   all_finite      whether a run of values holds no inf or NaN, to pick the safe inner loop that skips
//                   zero products (0 * NaN = NaN must not reach an output from a masked key).
//
// Register budget: MR x NV accumulators + NV packets of B + one broadcast. With 32 vector registers
// (AVX-512) 6 x 4 = 24 accumulators; with 16 (SSE, AVX2) 3 x 4 = 12 (B then comes from memory operands).
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

/// Rows of the register micro-tile (see the file comment for the budget).
inline constexpr int micro_rows = EIGEN_ARCH_DEFAULT_NUMBER_OF_REGISTERS >= 32 ? 6 : 3;
/// Packets across the micro-tile; also the width, in packets, of the fused kernels' lane blocks.
inline constexpr int micro_packets = 4;

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

/// The MR x NV micro-kernel: acc[m][v] = sum_k A(m, k) * B(k, v-th packet), A(m, k) = a[m * ams + k * aks].
/// Safe = true skips every product with a zero factor (keeps the accumulator instead of adding 0 * x), for
/// operands that may hold inf or NaN where the other factor is 0; every other term is the same pmadd as in the
/// fast kernel, so both give bitwise the same result on finite data.
template <typename T, int MR, int NV, bool Safe>
EIGEN_ALWAYS_INLINE void micro_kernel(Index depth, const T* a, Index ams, Index aks, const T* b, Index ldb,
                                      Packet<T> (&result)[MR][NV]) {
  using P = Packet<T>;
  constexpr Index ps = packet_size<T>;
  const P zero = Eigen::internal::pset1<P>(T(0));
  P acc[MR][NV];  // local, fully unrolled: the compiler keeps all of it in registers
  unroll<MR>([&](auto m) { unroll<NV>([&](auto v) { acc[m][v] = zero; }); });
  for (Index k = 0; k < depth; ++k) {
    const T* b_row = b + k * ldb;
    const T* a_col = a + k * aks;
    P bv[NV];
    unroll<NV>([&](auto v) { bv[v] = Eigen::internal::ploadu<P>(b_row + v * ps); });
    unroll<MR>([&](auto m) {
      const P av = Eigen::internal::pset1<P>(a_col[m * ams]);
      unroll<NV>([&](auto v) {
        if constexpr (Safe) {  // the same pmadd, kept only where neither factor is 0: bitwise the fast result
          const P skip = Eigen::internal::por(Eigen::internal::pcmp_eq(av, zero), Eigen::internal::pcmp_eq(bv[v], zero));
          acc[m][v] = Eigen::internal::pselect(skip, acc[m][v], Eigen::internal::pmadd(av, bv[v], acc[m][v]));
        } else {
          acc[m][v] = Eigen::internal::pmadd(av, bv[v], acc[m][v]);
        }
      });
    });
  }
  unroll<MR>([&](auto m) { unroll<NV>([&](auto v) { result[m][v] = acc[m][v]; }); });
}

/// Runs the micro-kernel over rows [0, M) in blocks of micro_rows (then one smaller block for the rest)
/// and calls epilogue(m0, acc) with acc a Packet<T>[R][NV] for rows m0 .. m0 + R - 1.
template <typename T, int NV, bool Safe, int R = micro_rows, typename Epilogue>
void gemm_rows_tail(Index m0, Index rest, Index depth, const T* a, Index ams, Index aks, const T* b,
                                        Index ldb, Epilogue& epilogue) {
  if constexpr (R >= 1) {
    if (rest == R) {
      Packet<T> acc[R][NV];
      micro_kernel<T, R, NV, Safe>(depth, a + m0 * ams, ams, aks, b, ldb, acc);
      epilogue(m0, acc);
    } else {
      gemm_rows_tail<T, NV, Safe, R - 1>(m0, rest, depth, a, ams, aks, b, ldb, epilogue);
    }
  }
}

template <typename T, int NV, bool Safe, typename Epilogue>
void gemm_panel(Index rows, Index depth, const T* a, Index ams, Index aks, const T* b, Index ldb, Epilogue&& epilogue) {
  constexpr int MR = micro_rows;
  Index m0 = 0;
  for (; m0 + MR <= rows; m0 += MR) {
    Packet<T> acc[MR][NV];
    micro_kernel<T, MR, NV, Safe>(depth, a + m0 * ams, ams, aks, b, ldb, acc);
    epilogue(m0, acc);
  }
  if (m0 < rows) gemm_rows_tail<T, NV, Safe, MR - 1>(m0, rows - m0, depth, a, ams, aks, b, ldb, epilogue);
}

/// gemm_panel with Safe chosen at run time.
template <typename T, int NV, typename Epilogue>
void gemm(bool safe, Index rows, Index depth, const T* a, Index ams, Index aks, const T* b, Index ldb,
          Epilogue&& epilogue) {
  if (safe)
    gemm_panel<T, NV, true>(rows, depth, a, ams, aks, b, ldb, epilogue);
  else
    gemm_panel<T, NV, false>(rows, depth, a, ams, aks, b, ldb, epilogue);
}

/// C[rows x NV packets] += A . B; C row m at c + m * ldc.
template <typename T, int NV>
void gemm_accumulate(bool safe, Index rows, Index depth, const T* a, Index ams, Index aks, const T* b, Index ldb, T* c,
                     Index ldc) {
  constexpr Index ps = packet_size<T>;
  gemm<T, NV>(safe, rows, depth, a, ams, aks, b, ldb, [&](Index m0, auto& acc) SELFATTN_INLINE_LAMBDA {
    constexpr int R = static_cast<int>(std::extent_v<std::remove_reference_t<decltype(acc)>>);
    unroll<R>([&](auto r) {
      T* row = c + (m0 + r) * ldc;
      unroll<NV>([&](auto v) {
        Eigen::internal::pstoreu(row + v * ps,
                                 Eigen::internal::padd(Eigen::internal::ploadu<Packet<T>>(row + v * ps), acc[r][v]));
      });
    });
  });
}

/// C[rows x NV packets] = A . B with the depth summed in chunks of `chunk` (each chunk from zero in registers,
/// then added to C in chunk order): about sqrt(chunk) + sqrt(depth / chunk) rounding steps instead of
/// sqrt(depth), for products whose results cancel against each other downstream. chunk_dot sums one dot
/// product in exactly this order.
template <typename T, int NV>
void gemm_store_chunked(Index rows, Index depth, Index chunk, const T* a, Index ams, Index aks, const T* b, Index ldb,
                        T* c, Index ldc) {
  constexpr Index ps = packet_size<T>;
  for (Index k0 = 0; k0 < depth || k0 == 0; k0 += chunk) {
    const bool first = k0 == 0;
    gemm_panel<T, NV, false>(rows, std::min(chunk, depth - k0), a + k0 * aks, ams, aks, b + k0 * ldb, ldb,
                             [&](Index m0, auto& acc) SELFATTN_INLINE_LAMBDA {
      constexpr int R = static_cast<int>(std::extent_v<std::remove_reference_t<decltype(acc)>>);
      unroll<R>([&](auto r) {
        T* row = c + (m0 + r) * ldc;
        unroll<NV>([&](auto v) {
          const Packet<T> sum =
              first ? acc[r][v] : Eigen::internal::padd(Eigen::internal::ploadu<Packet<T>>(row + v * ps), acc[r][v]);
          Eigen::internal::pstoreu(row + v * ps, sum);
        });
      });
    });
    if (depth == 0) break;
  }
}

/// x . y summed like one lane of gemm_store_chunked: the same instructions in the same order, so the two agree
/// bitwise on equal inputs.
template <typename T>
T chunk_dot(const T* x, const T* y, Index n, Index chunk) {
  using P = Packet<T>;
  P total = Eigen::internal::pset1<P>(T(0));
  for (Index k0 = 0; k0 < n; k0 += chunk) {
    P sum = Eigen::internal::pset1<P>(T(0));
    for (Index k = k0; k < std::min(n, k0 + chunk); ++k)
      sum = Eigen::internal::pmadd(Eigen::internal::pset1<P>(x[k]), Eigen::internal::pset1<P>(y[k]), sum);
    total = k0 == 0 ? sum : Eigen::internal::padd(total, sum);
  }
  return Eigen::internal::pfirst(total);
}

/// C[rows x packets] += A . B for any number of packets: chunks of micro_packets, then one narrower chunk.
template <typename T>
void gemm_accumulate_wide(bool safe, Index rows, Index packets, Index depth, const T* a, Index ams, Index aks,
                          const T* b, Index ldb, T* c, Index ldc) {
  static_assert(micro_packets == 4, "the tail below handles 1 to 3 packets");
  constexpr Index ps = packet_size<T>;
  Index v0 = 0;
  for (; v0 + micro_packets <= packets; v0 += micro_packets)
    gemm_accumulate<T, micro_packets>(safe, rows, depth, a, ams, aks, b + v0 * ps, ldb, c + v0 * ps, ldc);
  switch (packets - v0) {
    case 3: gemm_accumulate<T, 3>(safe, rows, depth, a, ams, aks, b + v0 * ps, ldb, c + v0 * ps, ldc); break;
    case 2: gemm_accumulate<T, 2>(safe, rows, depth, a, ams, aks, b + v0 * ps, ldb, c + v0 * ps, ldc); break;
    case 1: gemm_accumulate<T, 1>(safe, rows, depth, a, ams, aks, b + v0 * ps, ldb, c + v0 * ps, ldc); break;
    default: break;
  }
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

/// exp(s - m) where s is not -inf, exactly 0 where it is; one packet.
template <typename T>
EIGEN_STRONG_INLINE Packet<T> exp_or_zero(const Packet<T>& s, const Packet<T>& m) {
  using P = Packet<T>;
  const P minus_infinity = Eigen::internal::pset1<P>(-std::numeric_limits<T>::infinity());
  const P masked = Eigen::internal::pcmp_eq(s, minus_infinity);
  return Eigen::internal::pselect(masked, Eigen::internal::pset1<P>(T(0)), exp_packet<T>(Eigen::internal::psub(s, m)));
}

}  // namespace selfattn::detail::micro
