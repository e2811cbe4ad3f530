/// \file
/// `MhaWorkspace`: the buffers of one MultiHeadAttention inference call (projections, attention heads, lse, the
/// options it runs with) and the kernels' AttentionWorkspace, kept between calls: `forward_into` takes one, and
/// every KVCache holds one for `step_into`.
#pragma once

#include <selfattn/detail/checked_size.hpp>
#include <selfattn/options.hpp>
#include <selfattn/projection.hpp>
#include <selfattn/tensor.hpp>
#include <selfattn/workspace.hpp>

#include <array>
#include <cstddef>
#include <string>
#include <type_traits>
#include <vector>

namespace selfattn {

/// \brief The buffers of MultiHeadAttention::forward_into and step_into, reused from call to call: after a first
/// call of a shape, calls of that shape allocate nothing.
///
/// Holds the Q|K|V projection (B, L, E + 2 Hkv Dh), the attention heads (written straight into the merged
/// (B, L, E) layout), lse (B, H, L), the stacked projection weights of long inputs (and, with 16-bit parameters, the
/// widened weights of each projection that has 16 rows or more; with 16-bit activations, the inputs widened and the
/// float output before it is rounded), copies of the options
/// (assigned, so their vectors keep their capacity) and the kernels' AttentionWorkspace. Buffers only grow.
/// One workspace serves one call at a time. A KVCache holds the one step_into uses (`cache.step_workspace()`).
/// \code
/// MhaWorkspace<float> ws;
/// Tensor<float, 3> y({1, 128, 512});
/// for (const auto& x : batches) mha.forward_into(x, x, x, y, ws);   // no allocation after the first
/// \endcode
template <typename T>
struct MhaWorkspace {
  static_assert(std::is_floating_point_v<T>, "MhaWorkspace<T>: T must be float or double");

  /// \name Internal
  ///@{
  std::vector<T> projection;               ///< (B, L, Out_q + Out_k + Out_v), or three blocks for cross-attention
  std::vector<T> merged;                   ///< (B, L, E): the attention heads, split_heads' layout
  std::vector<T> lse;                      ///< (B, H, L)
  std::vector<T> widened_input;            ///< 16-bit activations: the inputs, widened exactly
  std::vector<T> widened_output;           ///< 16-bit activations: the output before its one rounding
  detail::StackedProjection<T> stacked;    ///< the stacked Q|K|V weights of a long self-attention input
  detail::StackedProjection<T> output_weights;  ///< 16-bit parameters, 16+ rows: the output projection's, widened
  detail::StackedProjection<T> key_weights;    ///< forward_into_with, cross-attention: the key projection's, widened
  detail::StackedProjection<T> value_weights;  ///< the same for the value projection (the query's go in `stacked`)
  AttentionOptions<T> options;             ///< the options the attention runs with
  AttentionOptions<T> sequence_options;    ///< step: one sequence's slice of them
  std::vector<Index> counts;               ///< step: the real new rows of each sequence
  std::vector<Index> lengths_before;       ///< step: the cache's lengths before the call
  AttentionWorkspace<T> attention;         ///< the kernels' scratch
  ///@}

  /// A contiguous view of `shape` over `buffer`, grown (never shrunk) to hold it. The shapes are computed from the
  /// inputs' extents (B * L * (E + 2 Hkv Dh), say): throws std::length_error naming the shape when its element count
  /// exceeds detail::max_elements(sizeof(T)), before the buffer grows.
  template <std::size_t N>
  static TensorView<T, static_cast<int>(N)> take(std::vector<T>& buffer, const std::array<Index, N>& shape) {
    const Index limit = detail::max_elements(sizeof(T));
    const Index size = detail::checked_product(shape, limit, [&] {
      const std::string text = detail::shape_string<static_cast<int>(N)>(shape) + " holds a number of elements that";
      return detail::size_limit_message("MhaWorkspace", "shape", text, limit,
                                        "elements of " + std::to_string(sizeof(T)) + " bytes");
    });
    if (buffer.size() < static_cast<std::size_t>(size)) buffer.resize(static_cast<std::size_t>(size));
    return TensorView<T, static_cast<int>(N)>(buffer.data(), shape);
  }
};

}  // namespace selfattn
