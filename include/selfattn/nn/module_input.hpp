/// \file
/// How the modules (MultiHeadAttention, the norms, FeedForward, TransformerLayer, TransformerStack) take a
/// (B, L, features) input: the compile-time check of the argument's type, and the input as a forward keeps it for its
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

/// The compile-time rule of the layers' entries (norms, FeedForward, TransformerLayer, TransformerStack):
/// (batch, length, features) Tensors or TensorViews holding the module's element type T. One sentence per mistake;
/// true when the rule holds, so that the entry compiles its body only then.
template <typename T, typename... X>
constexpr bool check_layer_arguments() {
  constexpr bool tensors = all_tensors<X...>;
  constexpr bool rank_3 = tensors && all_of_rank<3, X...>;
  static_assert(tensors, "selfattn layer: x, x_new and dout must be selfattn::Tensor or TensorView; an Eigen matrix is "
                         "not one (see as_view)");
  static_assert(!tensors || rank_3, "selfattn layer: x, x_new and dout must be rank 3: (batch, length, features)");
  static_assert(!rank_3 || all_hold<T, X...>, "selfattn layer<T>: x, x_new and dout must hold the layer's element type T");
  return rank_3 && all_hold<T, X...>;
}

/// The element type of the activations an inference entry (the modules' step, step_into, forward_into and their
/// _with forms) takes and returns for the argument X: X's when it is 16-bit, else the module's T.
template <typename T, typename X>
using activation_of = std::conditional_t<is_half_width_v<scalar_of<X>>, scalar_of<X>, T>;

/// The compile-time rule of the layers' inference entries (TransformerLayer and TransformerStack step): the layer's
/// type T (check_layer_arguments), or in a float layer a 16-bit x_new, widened on the way in and the output rounded
/// on the way out.
template <typename T, typename X>
constexpr bool check_layer_inference_arguments() {
  if constexpr (is_half_width_v<scalar_of<X>>) {
    constexpr bool rank_3 = all_of_rank<3, X>;
    static_assert(std::is_same_v<T, float>, "selfattn layer: 16-bit activations run in a float layer");
    static_assert(rank_3, "selfattn layer: x_new must be rank 3: (batch, length, features)");
    return std::is_same_v<T, float> && rank_3;
  } else {
    return check_layer_arguments<T, X>();
  }
}

}  // namespace selfattn::detail
