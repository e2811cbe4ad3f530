/// \file
/// 16-bit activations through a float module: the route of MultiHeadAttention's inference entries (step, step_into,
/// forward_into and their _with forms) when x_new, or query, key, value and output, hold bfloat16 or float16.
///
/// The inputs are widened exactly into the workspace, the module's float walk runs on them into a float output there,
/// and that output is rounded once into the caller's (to nearest even), only after the walk succeeded: on error
/// nothing is written. Activations of the module's own type go straight to the walk.
#pragma once

#include <selfattn/half_precision.hpp>
#include <selfattn/nn/module_workspace.hpp>
#include <selfattn/tensor.hpp>

#include <array>
#include <cstddef>
#include <type_traits>

namespace selfattn::detail {

/// Two views of the same elements in the same layout: the self-attention call (query = key = value), which is
/// widened once so that it still projects with one GEMM.
template <typename A>
bool same_view(const TensorView<const A, 3>& a, const TensorView<const A, 3>& b) {
  return a.data() == b.data() && a.shape() == b.shape() && a.strides() == b.strides();
}

/// walk(inputs, output) on the activations of A: directly when A is the module's T; for 16-bit A, on the inputs
/// widened exactly into ws.widened_input (one copy of an input that repeats an earlier one) and into a float output
/// in ws.widened_output, rounded once into `output` when the walk returns.
template <typename T, typename A, std::size_t N, typename Walk>
void run_on_activations(const std::array<TensorView<const A, 3>, N>& inputs, const TensorView<A, 3>& output,
                        MhaWorkspace<T>& ws, Walk&& walk) {
  if constexpr (std::is_same_v<A, T>) {
    walk(inputs, output);
  } else {
    static_assert(std::is_same_v<T, float> && is_half_width_v<A>, "16-bit activations run in a float module");
    // first[i]: the first input that input i repeats (i itself when it repeats none); only those are widened.
    std::array<std::size_t, N> first{};
    Index total = 0;
    for (std::size_t i = 0; i < N; ++i) {
      first[i] = 0;
      while (first[i] < i && !same_view(inputs[first[i]], inputs[i])) ++first[i];
      if (first[i] == i) total += inputs[i].size();
    }
    T* next = MhaWorkspace<T>::take(ws.widened_input, std::array<Index, 1>{total}).data();
    std::array<TensorView<const T, 3>, N> wide;
    for (std::size_t i = 0; i < N; ++i) {
      if (first[i] < i) {
        wide[i] = wide[first[i]];
        continue;
      }
      const TensorView<T, 3> to(next, inputs[i].shape());
      convert_view<A, T, 3>(inputs[i], to);
      wide[i] = to;
      next += inputs[i].size();
    }
    const TensorView<T, 3> wide_output = MhaWorkspace<T>::take(ws.widened_output, output.shape());
    walk(wide, wide_output);
    convert_view<T, A, 3>(wide_output, output);
  }
}

}  // namespace selfattn::detail
