// selfattn/detail/linear_widened.hpp — y = x W^T + b for a few rows of x (float) with W and b stored in 16 bits
// (bfloat16, float16): the projections of a decode step of a module run with 16-bit parameters.
//
// Such a product reads all of W for a few multiply-adds per element: it is bound by memory, and 16-bit weights
// halve its time. Each weight row is read once, a packet at a time, widened in registers (widen.hpp) and multiplied
// into every row of x; the outputs are shared among threads when there are many. Many rows of x (a prompt) take
// projection.hpp's other route: W widened once, then Eigen's GEMM.
#pragma once

#include <selfattn/detail/simd.hpp>
#include <selfattn/detail/threads.hpp>
#include <selfattn/detail/widen.hpp>
#include <selfattn/half_precision.hpp>
#include <selfattn/tensor.hpp>

#include <Eigen/Core>

#include <algorithm>
#include <array>

namespace selfattn::detail {

/// The most rows linear_few_rows takes (its row pointers live on the stack).
inline constexpr Index few_rows_max = 16;

/// y_r = x_r W^T + b for the rows r of x and y given by pointers (rows <= few_rows_max, each row contiguous):
/// y_r[o] = sum_i x_r[i] W[o][i] + b[o], W (Out, In) and b (Out) or empty of 16-bit type S, summed in T.
template <typename T, typename S>
void linear_few_rows(const std::array<const T*, few_rows_max>& x_rows, const std::array<T*, few_rows_max>& y_rows,
                     Index rows, Index in, const TensorView<const S, 2>& weight, const TensorView<const S, 1>& bias) {
  using P = micro::Packet<T>;
  using namespace Eigen::internal;
  constexpr Index ps = micro::packet_size<T>;
  constexpr Index block = 4;  // rows per pass over a weight row: 4 accumulators, one widened packet of W
  const Index outputs = weight.dim(0);
  const double work = static_cast<double>(rows) * static_cast<double>(outputs) * static_cast<double>(in);
  [[maybe_unused]] const int threads = threads_for(work, outputs);
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
#endif
  for (Index o = 0; o < outputs; ++o) {
    const S* w = weight.data() + o * weight.stride(0);
    const T b = bias.empty() ? T(0) : widen<T>(bias.data()[o * bias.stride(0)]);
    for (Index r0 = 0; r0 < rows; r0 += block) {
      const Index count = std::min(block, rows - r0);
      P acc[block];
      micro::unroll<block>([&](auto r) { acc[r] = pset1<P>(T(0)); });
      Index i = 0;
      for (; i + ps <= in; i += ps) {
        const P wv = micro::load_widened<T>(w + i);
        micro::unroll<block>([&](auto r) {
          if (r < count) acc[r] = pmadd(ploadu<P>(x_rows[static_cast<std::size_t>(r0 + r)] + i), wv, acc[r]);
        });
      }
      for (Index r = 0; r < count; ++r) {
        const T* x = x_rows[static_cast<std::size_t>(r0 + r)];
        T sum = predux(acc[r]);
        for (Index t = i; t < in; ++t) sum += x[t] * widen<T>(w[t]);
        y_rows[static_cast<std::size_t>(r0 + r)][o] = sum + b;
      }
    }
  }
}

}  // namespace selfattn::detail
