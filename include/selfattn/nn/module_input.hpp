/// \file
/// How the modules (MultiHeadAttention, the norms, FeedForward, TransformerLayer, TransformerStack) take a
/// (B, L, features) input: the compile-time rule of the arguments' types, and the input as a forward keeps it for its
/// backward (a view of the caller's tensor, or the temporary tensor itself, moved in).
#pragma once

#include <selfattn/half_precision.hpp>
#include <selfattn/tensor.hpp>

#include <memory>
#include <type_traits>
#include <utility>

namespace selfattn::detail {

/// A module input as the forward saves it for backward: a view of the caller's tensor, or of the temporary
/// tensor moved (or, if const, copied) into `owned`.
template <typename T>
struct SavedInput {
  TensorView<const T, 3> view;
  std::shared_ptr<const Tensor<T, 3>> owned;
};

template <typename T, typename X>
SavedInput<T> save_input(X&& x) {
  if constexpr (std::is_rvalue_reference_v<X&&> && std::is_same_v<std::decay_t<X>, Tensor<T, 3>>) {
    auto owned = std::make_shared<const Tensor<T, 3>>(std::forward<X>(x));
    return {owned->view(), std::move(owned)};
  } else {
    return {const_view(x), nullptr};
  }
}

/// The compile-time rule of every module entry (MultiHeadAttention, the norms, FeedForward, TransformerLayer,
/// TransformerStack): activations (query, key, value, x, x_new, output, dout) are (batch, length, features) Tensors or
/// TensorViews holding the module's element type T. One sentence per mistake; true when the rule holds, so that the
/// entry compiles its body only then.
template <typename T, typename... X>
constexpr bool check_module_arguments() {
  constexpr bool tensors = all_tensors<X...>;
  constexpr bool rank_3 = tensors && all_of_rank<3, X...>;
  static_assert(tensors, "selfattn module: query, key, value, x, x_new, output and dout must be selfattn::Tensor or "
                         "TensorView; an Eigen matrix is not one (see as_view)");
  static_assert(!tensors || rank_3, "selfattn module: query, key, value, x, x_new, output and dout must be rank 3: "
                                    "(batch, length, features)");
  static_assert(!rank_3 || all_hold<T, X...>,
                "selfattn module<T>: query, key, value, x, x_new, output and dout must hold the module's element type T");
  return rank_3 && all_hold<T, X...>;
}

/// The element type of the activations an inference entry (the modules' step, step_into, forward_into and their
/// _with forms) takes and returns for the argument X: X's when it is 16-bit, else the module's T.
template <typename T, typename X>
using activation_of = std::conditional_t<is_half_width_v<scalar_of<X>>, scalar_of<X>, T>;

/// The compile-time rule of the inference entries: the module's type T (check_module_arguments), or in a float module
/// activations that all hold one 16-bit type, widened on the way in and rounded on the way out
/// (nn/widened_activations.hpp).
template <typename T, typename X0, typename... X>
constexpr bool check_inference_arguments() {
  using A = scalar_of<X0>;
  if constexpr (is_half_width_v<A>) {
    constexpr bool rank_3 = all_tensors<X0, X...> && all_of_rank<3, X0, X...>;
    static_assert(std::is_same_v<T, float>, "selfattn module: 16-bit activations run in a float module");
    static_assert(rank_3, "selfattn module: query, key, value, x_new and output must be rank 3: (batch, length, "
                          "features)");
    static_assert(!rank_3 || all_hold<A, X...>,
                  "selfattn module: 16-bit activations: query, key, value and output all hold one 16-bit type");
    return std::is_same_v<T, float> && rank_3 && all_hold<A, X...>;
  } else {
    return check_module_arguments<T, X0, X...>();
  }
}

}  // namespace selfattn::detail
