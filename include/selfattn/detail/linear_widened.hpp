// selfattn/detail/linear_widened.hpp — y = x W^T + b for a few rows of x with W and b stored in T or in 16 bits
// (bfloat16, float16, widened to float): the projections of a decode step.
//
// Such a product reads all of W for a few multiply-adds per element: it is bound by memory, and 16-bit weights
// halve its time. Each weight row is read once, a few packets at a time (widened in registers, widen.hpp), and
// multiplied into every row of x; the outputs are shared among threads. Eigen's product does worse here: one row
// runs its GEMV on one thread, and 2 to 15 rows run its GEMM, which first packs all of W (2.2 to 2.8 GB/s of W
// against this kernel's 6 to 25, measured with 4096 x 1024 float weights from memory). Many rows of x (a prompt)
// take projection.hpp's other route: W widened once if it is 16-bit, then Eigen's GEMM.
#pragma once

#include <selfattn/detail/simd.hpp>
#include <selfattn/detail/threads.hpp>
#include <selfattn/detail/kernels.hpp>
#include <selfattn/half_precision.hpp>
#include <selfattn/tensor.hpp>

#include <Eigen/Core>

#include <algorithm>
#include <array>
#include <cmath>

namespace selfattn::detail {

/// The most rows linear_few_rows takes (its row pointers live on the stack).
inline constexpr Index few_rows_max = 16;

/// y_r = x_r W^T + b for the rows r of x and y given by pointers (rows <= few_rows_max, each row contiguous):
/// y_r[o] = sum_i x_r[i] W[o][i] + b[o], W (Out, In) and b (Out) or empty stored as S (T, or 16 bits widened to
/// T = float), summed in T.
///
/// Each pass reads one weight row, `unrolled` packets at a time, into up to 4 rows of x with `unrolled` accumulators
/// per row: independent multiply-add chains, so that one row is not held to the latency of a single chain. Outputs are
/// shared among threads; each y_r[o] is summed in one fixed order (the accumulators, their lanes, the tail, then b)
/// whatever the thread count, the row blocks and the storage type: 16-bit weights give bitwise the result of float
/// weights holding the same values.
template <typename T, typename S>
void linear_few_rows(const std::array<const T*, few_rows_max>& x_rows, const std::array<T*, few_rows_max>& y_rows,
                     Index rows, Index in, const TensorView<const S, 2>& weight, const TensorView<const S, 1>& bias) {
  using P = micro::Packet<T>;
  using namespace Eigen::internal;
  constexpr Index ps = micro::packet_size<T>;
  constexpr int block = 4;     // rows of x per pass over a weight row
  constexpr int unrolled = 4;  // packets of i per step, each with its own accumulator per row
  const Index outputs = weight.dim(0);
  const Index full_in = in / (ps * unrolled) * (ps * unrolled);
  const double work = static_cast<double>(rows) * static_cast<double>(outputs) * static_cast<double>(in);
  [[maybe_unused]] const int threads = threads_for(work, outputs);
  // Rows [r0, r0 + R) of output o, whose weight row is w and bias b.
  auto pass = [&](auto row_tile, Index r0, Index o, const S* w, T b) SELFATTN_INLINE_LAMBDA {
    constexpr int R = decltype(row_tile)::value;
    P acc[R][unrolled];
    micro::unroll<R>([&](auto r) { micro::unroll<unrolled>([&](auto u) { acc[r][u] = pset1<P>(T(0)); }); });
    for (Index i = 0; i < full_in; i += ps * unrolled) {
      P wv[unrolled];
      micro::unroll<unrolled>([&](auto u) { wv[u] = micro::load_widened<T>(w + i + u * ps); });
      micro::unroll<R>([&](auto r) {
        const T* x = x_rows[static_cast<std::size_t>(r0 + r)] + i;
        micro::unroll<unrolled>([&](auto u) { acc[r][u] = pmadd(ploadu<P>(x + u * ps), wv[u], acc[r][u]); });
      });
    }
    micro::unroll<R>([&](auto r) {
      const T* x = x_rows[static_cast<std::size_t>(r0 + r)];
      P sum = padd(padd(acc[r][0], acc[r][1]), padd(acc[r][2], acc[r][3]));
      Index i = full_in;
      for (; i + ps <= in; i += ps) sum = pmadd(ploadu<P>(x + i), micro::load_widened<T>(w + i), sum);
      T total = predux(sum);
      // std::fma, not x * w + total: the compiler may contract the latter into an FMA for one storage type and
      // not another (-ffp-contract), and the bits of 16-bit and float weights would part.
      for (; i < in; ++i) total = std::fma(x[i], widen<T>(w[i]), total);
      y_rows[static_cast<std::size_t>(r0 + r)][o] = total + b;
    });
  };
  static_assert(unrolled == 4, "the accumulators are added as a tree of four");
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
#endif
  for (Index o = 0; o < outputs; ++o) {
    const S* w = weight.data() + o * weight.stride(0);
    const T b = bias.empty() ? T(0) : widen<T>(bias.data()[o * bias.stride(0)]);
    micro::for_each_tile<block>(rows, [&](auto row_tile, Index r0) SELFATTN_INLINE_LAMBDA { pass(row_tile, r0, o, w, b); });
  }
}

}  // namespace selfattn::detail
