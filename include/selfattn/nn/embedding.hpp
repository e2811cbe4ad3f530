/// \file
/// Token embeddings: rows of a (V, E) table gathered by token id (PyTorch's nn.Embedding, F.embedding), and the
/// backward, which adds the gradient of each output row into its token's row of the table.
///
/// Dimension letters: B batch, L length, V vocabulary size (rows of the table), E embed dim.
///
///   forward:   y[b, l, :] = weight[tokens(b, l), :]
///   backward:  dweight[tokens(b, l), :] += dy[b, l, :]   for every (b, l)   (a token used twice collects both rows)
#pragma once

#include <selfattn/errors.hpp>
#include <selfattn/tensor.hpp>

#include <algorithm>
#include <array>
#include <string>

namespace selfattn {
namespace detail {

/// Throws std::invalid_argument naming `tokens`, the first position holding an id outside [0, V) and the id.
inline void check_token_ids(const char* function, const TensorView<const Index, 2>& tokens, Index vocab_size) {
  for (Index b = 0; b < tokens.dim(0); ++b)
    for (Index l = 0; l < tokens.dim(1); ++l) {
      const Index id = tokens(b, l);
      if (id < 0 || id >= vocab_size)
        throw_invalid(function, "tokens",
                      "id " + std::to_string(id) + " at (" + std::to_string(b) + ", " + std::to_string(l) +
                          ") is outside [0, " + std::to_string(vocab_size) + ")");
    }
}

}  // namespace detail

/// \brief The embedding lookup y[b, l, :] = weight[tokens(b, l), :], PyTorch's F.embedding(tokens, weight).
///
/// Shapes: weight (V, E), tokens (B, L) of ids in [0, V) -> y (B, L, E).
/// Checks first: std::invalid_argument naming `tokens` (with the position) for an id outside [0, V).
/// \code
/// Tensor<float, 2> table({V, E});                      // learned
/// Tensor<Index, 2> tokens({2, 5});                     // ids
/// Tensor<float, 3> x = embedding<float>(table, tokens);   // (2, 5, E)
/// \endcode
template <typename T>
Tensor<T, 3> embedding(const TensorView<const T, 2>& weight, const TensorView<const Index, 2>& tokens) {
  detail::check_token_ids("embedding", tokens, weight.dim(0));
  const Index e = weight.dim(1);
  Tensor<T, 3> y({tokens.dim(0), tokens.dim(1), e});
  for (Index b = 0; b < tokens.dim(0); ++b)
    for (Index l = 0; l < tokens.dim(1); ++l) {
      const T* row = weight.data() + tokens(b, l) * weight.stride(0);
      std::copy(row, row + e, &y(b, l, 0));
    }
  return y;
}

/// \brief The backward of embedding, accumulated: dweight[tokens(b, l), :] += dy[b, l, :] for every (b, l).
///
/// Adds into dweight (zero it first for the gradient alone; an output head tied to the same table adds its own
/// gradient to it). Rows of tokens that do not occur are left as they are.
///
/// Shapes: tokens (B, L) of ids in [0, V), dy (B, L, E), dweight (V, E), writable.
/// Checks first: ShapeError naming `dy` or `dweight`, std::invalid_argument naming `tokens`; nothing is written then.
/// \code
/// Tensor<float, 2> dtable(table.shape());
/// embedding_backward_into<float>(tokens, dx, dtable);   // dx = d loss / d x (2, 5, E)
/// \endcode
template <typename T>
void embedding_backward_into(const TensorView<const Index, 2>& tokens, const TensorView<const T, 3>& dy,
                             const TensorView<T, 2>& dweight) {
  const char* fn = "embedding_backward_into";
  detail::check_shape<3>(fn, "dy", dy.shape(), {tokens.dim(0), tokens.dim(1), detail::any_extent});
  detail::check_shape<2>(fn, "dweight", dweight.shape(), {detail::any_extent, dy.dim(2)});
  detail::check_token_ids(fn, tokens, dweight.dim(0));
  // Serial on purpose: two positions holding the same token write the same row.
  for (Index b = 0; b < tokens.dim(0); ++b)
    for (Index l = 0; l < tokens.dim(1); ++l)
      as_vector(dweight[tokens(b, l)]) += as_vector(dy[b][l]);
}

/// \brief The backward of embedding as a new (V, E) tensor: dweight[v, :] = sum of dy[b, l, :] over tokens(b, l) = v.
///
/// Shapes: tokens (B, L) of ids in [0, V), dy (B, L, E) -> dweight (V, E) with V = vocab_size.
/// Checks first: ShapeError naming `dy`, std::invalid_argument naming `vocab_size` (< 0) or `tokens`.
/// \code
/// Tensor<float, 2> dtable = embedding_backward<float>(tokens, dx, V);
/// \endcode
template <typename T>
Tensor<T, 2> embedding_backward(const TensorView<const Index, 2>& tokens, const TensorView<const T, 3>& dy,
                                Index vocab_size) {
  if (vocab_size < 0)
    detail::throw_invalid("embedding_backward", "vocab_size", "expected >= 0, got " + std::to_string(vocab_size));
  detail::check_shape<3>("embedding_backward", "dy", dy.shape(), {tokens.dim(0), tokens.dim(1), detail::any_extent});
  detail::check_token_ids("embedding_backward", tokens, vocab_size);
  Tensor<T, 2> dweight({vocab_size, dy.dim(2)});
  embedding_backward_into<T>(tokens, dy, dweight);
  return dweight;
}

}  // namespace selfattn
