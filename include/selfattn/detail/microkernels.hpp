// selfattn/detail/microkernels.hpp — the register-blocked products of the fast kernels.
//
//   micro_kernel    acc[MR][NV packets] = A[MR x K] . B[K x NV packets], A read element by element (broadcast,
//                   any strides: a row-major, a transposed or a strided head view all work without a copy),
//                   B read as packets from rows ldb apart; the accumulators stay in registers for the whole K
//                   loop. Safe = true skips every product with a zero factor (for operands that may hold inf or
//                   NaN where the other factor is 0). An optional prefetcher is stepped once per K.
//   gemm_panel      the micro-kernel over any number of rows; an epilogue functor receives each block of
//                   accumulators and decides what to do (store, accumulate, rescale and accumulate, ...).
//   gemm_*          the epilogues the kernels use, and chunk_dot, a dot product summed like one lane of them.
//
// Register budget: MR x NV accumulators + NV packets of B + one broadcast. With 32 vector registers
// (AVX-512) 6 x 4 = 24 accumulators; with 16 (SSE, AVX2) 3 x 4 = 12 (B then comes from memory operands).
#pragma once

#include <selfattn/detail/simd.hpp>
#include <selfattn/half_precision.hpp>
#include <selfattn/tensor.hpp>

#include <Eigen/Core>

#include <algorithm>
#include <type_traits>

namespace selfattn::detail::micro {

/// Rows of the register micro-tile (see the file comment for the budget).
inline constexpr int micro_rows = EIGEN_ARCH_DEFAULT_NUMBER_OF_REGISTERS >= 32 ? 6 : 3;
/// Packets across the micro-tile; also the width, in packets, of the fused kernels' lane blocks.
inline constexpr int micro_packets = 4;

/// The MR x NV micro-kernel: acc[m][v] = sum_k A(m, k) * B(k, v-th packet), A(m, k) = a[m * ams + k * aks].
/// Safe = true skips every product with a zero factor (keeps the accumulator instead of adding 0 * x), for
/// operands that may hold inf or NaN where the other factor is 0; every other term is the same pmadd as in the
/// fast kernel, so both give bitwise the same result on finite data. prefetcher.step(k) runs at every k (the
/// default NoPrefetch compiles away; the decode kernels prefetch the next chunk with a LinePrefetcher). A may be a
/// 16-bit storage type (a bfloat16 or float16 KV cache read in place): each element is widened to T exactly as it
/// is broadcast, so the arithmetic is T's.
template <typename T, int MR, int NV, bool Safe, typename Prefetcher = NoPrefetch, typename A = T>
EIGEN_ALWAYS_INLINE void micro_kernel(Index depth, const A* a, Index ams, Index aks, const T* b, Index ldb,
                                      Packet<T> (&result)[MR][NV], Prefetcher&& prefetcher = Prefetcher()) {
  using P = Packet<T>;
  constexpr Index ps = packet_size<T>;
  const P zero = Eigen::internal::pset1<P>(T(0));
  P acc[MR][NV];  // local, fully unrolled: the compiler keeps all of it in registers
  unroll<MR>([&](auto m) { unroll<NV>([&](auto v) { acc[m][v] = zero; }); });
  for (Index k = 0; k < depth; ++k) {
    prefetcher.step(k);
    const T* b_row = b + k * ldb;
    const A* a_col = a + k * aks;
    P bv[NV];
    unroll<NV>([&](auto v) { bv[v] = Eigen::internal::ploadu<P>(b_row + v * ps); });
    unroll<MR>([&](auto m) {
      const P av = Eigen::internal::pset1<P>(widen<T>(a_col[m * ams]));
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

}  // namespace selfattn::detail::micro
