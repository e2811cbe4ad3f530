/// \file
/// `AttentionWorkspace`: the attention kernels' scratch memory, kept between calls so that a loop of calls of one
/// shape allocates nothing after its first call.
#pragma once

#include <selfattn/detail/decode.hpp>
#include <selfattn/detail/fused_scratch.hpp>
#include <selfattn/detail/fused_scratch.hpp>
#include <selfattn/detail/widened_inputs.hpp>
#include <selfattn/tensor.hpp>

#include <type_traits>

namespace selfattn {

/// \brief Scratch memory of the attention kernels, reused from call to call: pass one to `sdpa_forward_into` or
/// `sdpa_backward_into` and, after a first call of a shape, further calls of that shape (or smaller) allocate
/// nothing.
///
/// A workspace of float serves calls on bfloat16 and float16 inputs too (their compute type is float).
/// It holds what the fused forward, the decode kernel and the fused backward otherwise allocate inside each call:
/// per-thread tiles, the decode kernel's query layouts and partials, the backward's row sums and accumulators.
/// Containers only grow; nothing in it affects results (a call with a workspace writes bitwise what the same call
/// without one writes). The reference kernel (`opts.kernel = Kernel::reference`, the specification) does not use
/// it and allocates per call. One workspace serves one call at a time: threads calling concurrently need one each.
/// Under OpenMP a call with more threads than any before it grows the per-thread parts once.
/// \code
/// AttentionWorkspace<float> ws;
/// Tensor<float, 4> out({1, 8, 1, 64});
/// Tensor<float, 3> lse({1, 8, 1});
/// for (int step = 0; step < steps; ++step) sdpa_forward_into(q, k, v, out, lse, opts, ws);  // no allocation
/// \endcode
template <typename T>
struct AttentionWorkspace {
  static_assert(std::is_floating_point_v<T>, "AttentionWorkspace<T>: T must be float or double");

  /// \brief Room for the decode kernel's partials over up to `keys` keys: a loop whose key count grows (a KV
  /// cache) reserves once instead of growing every decode_chunk (256) keys. `pairs` (batch, key/value head)
  /// pairs, `rows` query rows per key/value head (G * Lq), values of `value_dim`.
  /// Throws std::length_error naming the arguments when the partials' element count would exceed
  /// detail::max_elements(sizeof(T)) (PTRDIFF_MAX bytes), before anything is allocated.
  void reserve_decode(Index pairs, Index rows, Index keys, Index value_dim) {
    decode.reserve(pairs, rows, keys, value_dim);
  }

  /// \name Internal: each kernel's part
  ///@{
  detail::FusedForwardScratch<T> fused;    ///< the fused forward's per-thread tiles
  detail::DecodeScratch<T> decode;         ///< the decode kernel's rows, queries, partials and per-thread scores
  detail::FusedBackwardScratch<T> backward;  ///< the fused backward's row sums, per-thread tiles and accumulators
  detail::WideningScratch<T> widened;        ///< 16-bit inputs widened to T, and the output before it is rounded
  ///@}
};

}  // namespace selfattn
