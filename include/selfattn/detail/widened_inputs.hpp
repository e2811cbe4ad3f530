// selfattn/detail/widened_inputs.hpp — 16-bit attention inputs widened to float where a kernel reads float: a
// 16-bit call's q, and k and v for the reference kernel (the decode kernel reads 16-bit keys and values in place,
// decode.hpp; the fused kernel widens a tile at a time, fused_forward.hpp), and the scratch that holds them between
// calls (AttentionWorkspace::widened).
#pragma once

#include <selfattn/detail/kernels.hpp>
#include <selfattn/detail/simd.hpp>
#include <selfattn/detail/threads.hpp>
#include <selfattn/half_precision.hpp>
#include <selfattn/quantized.hpp>
#include <selfattn/tensor.hpp>

#include <array>
#include <cstdint>

namespace selfattn::detail {

/// Float copies of 16-bit inputs and the float output before it is rounded: containers only grow, so a loop of
/// calls of one shape allocates after its first call no more than the float kernels do.
template <typename T>
struct WideningScratch {
  micro::Buffer<T> query;  ///< q widened (16-bit public calls)
  micro::Buffer<T> key;    ///< k widened, when the reference kernel runs on 16-bit keys
  micro::Buffer<T> value;  ///< v widened, likewise
  micro::Buffer<T> out;    ///< the output in T, before it is rounded to the inputs' type
};

/// A contiguous view of `shape` over the first elements of buffer (grown when too small).
template <typename T, int Rank>
TensorView<T, Rank> take_buffer(micro::Buffer<T>& buffer, const std::array<Index, Rank>& shape) {
  const Index size = product<Rank>(shape);
  if (buffer.size() < static_cast<std::size_t>(size)) buffer.resize(static_cast<std::size_t>(size));
  return TensorView<T, Rank>(buffer.data(), shape);
}

/// destination = source converted element by element (convert_view), the (batch, head) planes shared among the
/// threads when there are many elements: the widening of a 16-bit call's q and the rounding of its out would
/// otherwise run on one thread beside kernels that run on all.
template <typename From, typename To>
void convert_planes(const TensorView<const From, 4>& source, const TensorView<To, 4>& destination) {
  const Index heads = source.dim(1), planes = source.dim(0) * heads;
  [[maybe_unused]] const int threads = threads_for(static_cast<double>(source.size()), planes);
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
#endif
  for (Index plane = 0; plane < planes; ++plane) {
    const Index b = plane / heads, h = plane % heads;
    const std::array<Index, 2> shape{source.dim(2), source.dim(3)};
    const TensorView<const From, 2> from(source.data() + b * source.stride(0) + h * source.stride(1), shape,
                                         {source.stride(2), source.stride(3)});
    const TensorView<To, 2> to(destination.data() + b * destination.stride(0) + h * destination.stride(1), shape,
                               {destination.stride(2), destination.stride(3)});
    convert_view<From, To, 2>(from, to);
  }
}

/// x converted exactly to T, contiguous, in buffer.
template <typename T, typename S, int Rank>
TensorView<T, Rank> widen_into(const TensorView<const S, Rank>& x, micro::Buffer<T>& buffer) {
  const TensorView<T, Rank> wide = take_buffer<T, Rank>(buffer, x.shape());
  if constexpr (Rank == 4)
    convert_planes<S, T>(x, wide);
  else
    convert_view<S, T, Rank>(x, wide);
  return wide;
}

/// The floats x̂ = s q of int8 values x (B, H, L, D) with their block scales (B, H, L, int8_blocks(D)), contiguous, in
/// buffer: exact (quantized.hpp).
inline TensorView<float, 4> dequantize_into(const TensorView<const std::int8_t, 4>& x,
                                            const TensorView<const bfloat16, 4>& scales, micro::Buffer<float>& buffer) {
  const TensorView<float, 4> wide = take_buffer<float, 4>(buffer, x.shape());
  dequantize_planes(x, scales, wide);
  return wide;
}

}  // namespace selfattn::detail
