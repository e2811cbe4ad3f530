// selfattn/detail/widened_inputs.hpp — 16-bit attention inputs widened to float for the kernels that read float
// (the fused and reference kernels; the decode kernel reads 16-bit keys and values in place, decode.hpp), and the
// scratch that holds them between calls (AttentionWorkspace::widened).
#pragma once

#include <selfattn/detail/simd.hpp>
#include <selfattn/half_precision.hpp>
#include <selfattn/tensor.hpp>

namespace selfattn::detail {

/// Float copies of 16-bit inputs and the float output before it is rounded: containers only grow, so a loop of
/// calls of one shape allocates after its first call no more than the float kernels do.
template <typename T>
struct WideningScratch {
  micro::Buffer<T> query;  ///< q widened (16-bit public calls)
  micro::Buffer<T> key;    ///< k widened, when the fused or reference kernel runs on 16-bit keys
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

/// x converted exactly to T, contiguous, in buffer.
template <typename T, typename S, int Rank>
TensorView<T, Rank> widen_into(const TensorView<const S, Rank>& x, micro::Buffer<T>& buffer) {
  const TensorView<T, Rank> wide = take_buffer<T, Rank>(buffer, x.shape());
  convert_view<S, T, Rank>(x, wide);
  return wide;
}

}  // namespace selfattn::detail
