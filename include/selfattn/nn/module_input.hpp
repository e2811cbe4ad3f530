/// \file
/// How the modules (MultiHeadAttention, the norms, FeedForward, TransformerLayer, TransformerStack) take a
/// (B, L, features) input: the compile-time check of the argument's type, and the input as a forward keeps it for its
/// backward (a view of the caller's tensor, or the temporary tensor itself, moved in).
#pragma once

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

}  // namespace selfattn::detail
