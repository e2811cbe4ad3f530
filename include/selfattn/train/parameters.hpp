/// \file
/// The trainable tensors of a model beside their gradients, as a flat list that an optimizer (train/adamw.hpp) and
/// gradient clipping walk: ParameterRef, add_parameter, add_parameters for the modules' parameter structs (every
/// tensor of a MultiHeadAttention, a TransformerLayer, a TransformerStack, a TransformerDecoderLayer or a
/// TransformerDecoderStack), and clipping by the global norm.
///
/// A list holds pointers into the tensors: it is valid while the parameters and the gradients it was made from
/// live and keep their storage. Gradients come new from every backward, so build the list after each backward
/// (it costs a few string copies per tensor); optimizers match their state to it by position.
/// \code
/// auto g = model.backward(dout, fwd);                    // TransformerStackGradients<float>
/// std::vector<ParameterRef<float>> params;
/// add_parameter(params, "embedding", table, dtable, /*decay=*/false);
/// add_parameters(params, model.params(), g.params, "stack.");
/// clip_grad_norm(params, 1.0);
/// adamw.step(params, schedule.learning_rate(step));
/// \endcode
#pragma once

#include <selfattn/errors.hpp>
#include <selfattn/nn/multihead.hpp>
#include <selfattn/nn/transformer_decoder_layer.hpp>
#include <selfattn/nn/transformer_decoder_stack.hpp>
#include <selfattn/nn/transformer_layer.hpp>
#include <selfattn/nn/transformer_stack.hpp>
#include <selfattn/tensor.hpp>

#include <cmath>
#include <string>
#include <vector>

namespace selfattn {

/// \brief One trainable tensor beside its gradient, both as flat arrays of `size` elements.
template <typename T>
struct ParameterRef {
  std::string name;    ///< for messages, e.g. "stack.layers.0.self_attn.q_weight"
  T* value = nullptr;  ///< the parameter's elements, updated in place by an optimizer
  T* grad = nullptr;   ///< its gradient, as many elements (clip_grad_norm scales it in place)
  Index size = 0;      ///< number of elements of each
  bool decay = true;   ///< whether weight decay applies to it (AdamW)
};

/// \brief Appends `value` and its gradient `grad` to `list` under `name`; nothing when both are empty (an absent
/// bias). ShapeError naming `name` when their shapes differ.
///
/// Shapes: value and grad of one shape, any rank.
/// \code
/// add_parameter(params, "embedding", table, dtable, /*decay=*/false);   // table, dtable (V, E)
/// \endcode
template <typename T, int Rank>
void add_parameter(std::vector<ParameterRef<T>>& list, const std::string& name, Tensor<T, Rank>& value,
                   Tensor<T, Rank>& grad, bool decay) {
  detail::check_shape<static_cast<std::size_t>(Rank)>("add_parameter", name + " gradient", grad.shape(), value.shape());
  if (value.size() == 0) return;
  list.push_back({name, value.data(), grad.data(), value.size(), decay});
}

namespace detail {

// The walks of add_parameters, into a list of their own that the public overloads append once it is complete.
template <typename T>
void append_parameters(std::vector<ParameterRef<T>>& list, MhaParams<T>& params, MhaParams<T>& grads,
                       const std::string& prefix) {
  add_parameter(list, prefix + "q_weight", params.q_weight, grads.q_weight, true);
  add_parameter(list, prefix + "k_weight", params.k_weight, grads.k_weight, true);
  add_parameter(list, prefix + "v_weight", params.v_weight, grads.v_weight, true);
  add_parameter(list, prefix + "out_weight", params.out_weight, grads.out_weight, true);
  add_parameter(list, prefix + "q_bias", params.q_bias, grads.q_bias, false);
  add_parameter(list, prefix + "k_bias", params.k_bias, grads.k_bias, false);
  add_parameter(list, prefix + "v_bias", params.v_bias, grads.v_bias, false);
  add_parameter(list, prefix + "out_bias", params.out_bias, grads.out_bias, false);
  add_parameter(list, prefix + "sinks", params.sinks, grads.sinks, false);
}

/// The FFN's and the first two norms' tensors, shared by the encoder and the decoder layer.
template <typename T, typename LayerParams>
void append_ffn_and_norms(std::vector<ParameterRef<T>>& list, LayerParams& params, LayerParams& grads,
                          const std::string& prefix) {
  add_parameter(list, prefix + "linear1_weight", params.linear1_weight, grads.linear1_weight, true);
  add_parameter(list, prefix + "linear1_bias", params.linear1_bias, grads.linear1_bias, false);
  add_parameter(list, prefix + "linear2_weight", params.linear2_weight, grads.linear2_weight, true);
  add_parameter(list, prefix + "linear2_bias", params.linear2_bias, grads.linear2_bias, false);
  add_parameter(list, prefix + "norm1_weight", params.norm1_weight, grads.norm1_weight, false);
  add_parameter(list, prefix + "norm1_bias", params.norm1_bias, grads.norm1_bias, false);
  add_parameter(list, prefix + "norm2_weight", params.norm2_weight, grads.norm2_weight, false);
  add_parameter(list, prefix + "norm2_bias", params.norm2_bias, grads.norm2_bias, false);
}

template <typename T>
void append_parameters(std::vector<ParameterRef<T>>& list, TransformerLayerParams<T>& params,
                       TransformerLayerParams<T>& grads, const std::string& prefix) {
  append_parameters(list, params.self_attn, grads.self_attn, prefix + "self_attn.");
  append_ffn_and_norms(list, params, grads, prefix);
}

template <typename T>
void append_parameters(std::vector<ParameterRef<T>>& list, TransformerDecoderLayerParams<T>& params,
                       TransformerDecoderLayerParams<T>& grads, const std::string& prefix) {
  append_parameters(list, params.self_attn, grads.self_attn, prefix + "self_attn.");
  append_parameters(list, params.multihead_attn, grads.multihead_attn, prefix + "multihead_attn.");
  append_ffn_and_norms(list, params, grads, prefix);
  add_parameter(list, prefix + "norm3_weight", params.norm3_weight, grads.norm3_weight, false);
  add_parameter(list, prefix + "norm3_bias", params.norm3_bias, grads.norm3_bias, false);
}

/// A stack's layers under "layers.i.", then its final norm (TransformerStackParams, TransformerDecoderStackParams).
template <typename T, typename StackParams>
void append_stack_parameters(std::vector<ParameterRef<T>>& list, StackParams& params, StackParams& grads,
                             const std::string& prefix) {
  if (grads.layers.size() != params.layers.size())
    throw_invalid("add_parameters", "grads.layers",
                  "expected " + std::to_string(params.layers.size()) + " layers, got " +
                      std::to_string(grads.layers.size()));
  for (std::size_t i = 0; i < params.layers.size(); ++i)
    append_parameters(list, params.layers[i], grads.layers[i], prefix + "layers." + std::to_string(i) + ".");
  add_parameter(list, prefix + "norm_weight", params.norm_weight, grads.norm_weight, false);
  add_parameter(list, prefix + "norm_bias", params.norm_bias, grads.norm_bias, false);
}

template <typename T>
void append_parameters(std::vector<ParameterRef<T>>& list, TransformerStackParams<T>& params,
                       TransformerStackParams<T>& grads, const std::string& prefix) {
  append_stack_parameters(list, params, grads, prefix);
}

template <typename T>
void append_parameters(std::vector<ParameterRef<T>>& list, TransformerDecoderStackParams<T>& params,
                       TransformerDecoderStackParams<T>& grads, const std::string& prefix) {
  append_stack_parameters(list, params, grads, prefix);
}

}  // namespace detail

/// \brief Appends every tensor of a model's parameters beside its gradient: MhaParams, TransformerLayerParams,
/// TransformerStackParams, TransformerDecoderLayerParams or TransformerDecoderStackParams. On an error `list` is
/// unchanged.
///
/// The names, each starting with `prefix`, are those of the parameter structs:
/// - an attention's `q_weight`, `k_weight`, `v_weight`, `out_weight`, `q_bias`, `k_bias`, `v_bias`, `out_bias`;
/// - a layer's attention under "self_attn." (a decoder layer's cross-attention under "multihead_attn."), then
///   `linear1_weight`, `linear1_bias`, `linear2_weight`, `linear2_bias`, `norm1_weight`, `norm1_bias`,
///   `norm2_weight`, `norm2_bias` (and a decoder layer's `norm3_weight`, `norm3_bias`);
/// - a stack's layer i under "layers.i.", then the final norm's `norm_weight`, `norm_bias`.
///
/// Weight decay applies to the matrices only, never to biases and norm weights (the usual choice for AdamW).
/// Absent tensors (the biases of a module without them) are skipped. Throws ShapeError naming the tensor when a
/// gradient's shape differs from its parameter's, std::invalid_argument naming `grads.layers` when a stack's
/// gradients hold another number of layers.
///
/// Shapes: `grads` has the shapes of `params` (what the model's backward returns).
/// \code
/// add_parameters(params, stack.params(), g.params, "stack.");   // "stack.layers.0.self_attn.q_weight", ...
/// \endcode
template <typename T, template <typename> class Params>
void add_parameters(std::vector<ParameterRef<T>>& list, Params<T>& params, Params<T>& grads,
                    const std::string& prefix = "") {
  std::vector<ParameterRef<T>> added;
  detail::append_parameters(added, params, grads, prefix);
  list.insert(list.end(), added.begin(), added.end());
}

/// \brief The global L2 norm of every gradient in `list`, sqrt(sum of squares), accumulated in double.
template <typename T>
double grad_norm(const std::vector<ParameterRef<T>>& list) {
  double sum = 0;
  for (const ParameterRef<T>& p : list)
    for (Index n = 0; n < p.size; ++n) sum += static_cast<double>(p.grad[n]) * static_cast<double>(p.grad[n]);
  return std::sqrt(sum);
}

/// \brief Clipping by the global norm, PyTorch's clip_grad_norm_: when the norm of all gradients together exceeds
/// `max_norm`, every gradient is scaled by max_norm / (norm + 1e-6) (same direction, shorter step). Returns the
/// norm before clipping. A non-finite norm is returned as it is and nothing is scaled: skip that step.
/// std::invalid_argument naming `max_norm` unless it is finite and > 0.
/// \code
/// const double norm = clip_grad_norm(params, 1.0);
/// if (std::isfinite(norm)) adamw.step(params, lr);
/// \endcode
template <typename T>
double clip_grad_norm(const std::vector<ParameterRef<T>>& list, double max_norm) {
  if (!(max_norm > 0) || !std::isfinite(max_norm))
    detail::throw_invalid("clip_grad_norm", "max_norm", "expected a finite number > 0, got " + std::to_string(max_norm));
  const double norm = grad_norm(list);
  const double coefficient = max_norm / (norm + 1e-6);
  if (std::isfinite(norm) && coefficient < 1.0)
    for (const ParameterRef<T>& p : list)
      for (Index n = 0; n < p.size; ++n) p.grad[n] = static_cast<T>(static_cast<double>(p.grad[n]) * coefficient);
  return norm;
}

}  // namespace selfattn
