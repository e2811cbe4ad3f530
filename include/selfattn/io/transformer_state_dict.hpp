/// \file
/// PyTorch state dicts of nn.TransformerEncoderLayer and nn.TransformerEncoder mapped to and from
/// TransformerLayerParams and TransformerStackParams, so a PyTorch layer or encoder loads as it is.
///
/// The names of a layer (under a prefix), with E = embed_dim, F = ffn_dim (Fz = 2F for SwiGLU):
///
///     self_attn.in_proj_weight ... self_attn.out_proj.bias    the attention (io/state_dict.hpp)
///     linear1.weight  (Fz, E)      linear1.bias  (Fz)         when cfg.bias
///     linear2.weight  (E, F)       linear2.bias  (E)          when cfg.bias
///     norm1.weight    (E)          norm1.bias    (E)          bias when cfg.bias and LayerNorm
///     norm2.weight    (E)          norm2.bias    (E)
///
/// and of a stack: `layers.i.` + a layer's names for i = 0 .. N-1 (`layers.0.linear1.weight`), then `norm.weight`, `norm.bias` (the final norm).
/// Loading is strict, like `load_state_dict(strict=True)`: every key under the prefix must be one of these.
#pragma once

#include <selfattn/errors.hpp>
#include <selfattn/io/npy.hpp>
#include <selfattn/io/state_dict.hpp>
#include <selfattn/nn/activation.hpp>
#include <selfattn/nn/transformer_layer.hpp>
#include <selfattn/nn/transformer_stack.hpp>
#include <selfattn/tensor.hpp>

#include <algorithm>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace selfattn {

namespace detail {

/// The layer's own keys (not the attention's) with their shapes; `present` false for an absent bias.
struct LayerStateDictEntry {
  const char* name;
  std::vector<Index> shape;
  bool present;
};

inline std::vector<LayerStateDictEntry> layer_state_dict_entries(const TransformerLayerConfig& c) {
  const Index e = c.attention.embed_dim, f = c.ffn_dim, fz = activation_input_width(c.activation, f);
  const bool norm_bias = c.bias && c.norm == NormKind::layer_norm;
  return {{"linear1.weight", {fz, e}, true}, {"linear1.bias", {fz}, c.bias},      {"linear2.weight", {e, f}, true},
          {"linear2.bias", {e}, c.bias},     {"norm1.weight", {e}, true},         {"norm1.bias", {e}, norm_bias},
          {"norm2.weight", {e}, true},       {"norm2.bias", {e}, norm_bias}};
}

/// The layer's tensors in the order of layer_state_dict_entries.
template <typename P>
auto layer_tensors(P& p) {
  return std::make_tuple(&p.linear1_weight, &p.linear1_bias, &p.linear2_weight, &p.linear2_bias, &p.norm1_weight,
                         &p.norm1_bias, &p.norm2_weight, &p.norm2_bias);
}

/// Calls f(index, tensor pointer) for the layer's eight tensors, in entry order.
template <typename P, typename F>
void for_each_layer_tensor(P& p, F&& f) {
  std::apply([&](auto*... tensors) {
    std::size_t n = 0;
    (f(n++, tensors), ...);
  }, layer_tensors(p));
}

/// Every key under `prefix` must be `self_attn.*` or one of the layer's own names.
template <typename T>
void check_layer_keys(const char* fn, const StateDict<T>& sd, const std::string& prefix,
                      const std::vector<LayerStateDictEntry>& entries) {
  for (const auto& entry : sd) {
    if (!has_prefix(entry.first, prefix)) continue;
    const std::string rest = entry.first.substr(prefix.size());
    if (has_prefix(rest, "self_attn.")) continue;  // checked by mha_params_from_state_dict
    const bool known = std::any_of(entries.begin(), entries.end(), [&](const LayerStateDictEntry& e) {
      return e.present && rest == e.name;
    });
    if (!known) {
      const bool absent = std::any_of(entries.begin(), entries.end(), [&](const LayerStateDictEntry& e) { return rest == e.name; });
      throw_invalid(fn, entry.first,
                    absent ? "present, but the configuration has no such parameter (cfg.bias false, or RMSNorm)"
                           : "unexpected key (not a parameter of nn.TransformerEncoderLayer)");
    }
  }
}

template <typename T>
TransformerLayerParams<T> layer_params_from_state_dict(const char* fn, const StateDict<T>& sd,
                                                       const TransformerLayerConfig& cfg, const std::string& prefix) {
  const std::vector<LayerStateDictEntry> entries = layer_state_dict_entries(cfg);
  check_layer_keys(fn, sd, prefix, entries);
  TransformerLayerParams<T> p;
  p.self_attn = mha_params_from_state_dict(sd, cfg.attention, prefix + "self_attn.");
  for_each_layer_tensor(p, [&](std::size_t n, auto* tensor) {
    const LayerStateDictEntry& e = entries[n];
    if (!e.present) return;
    using Target = std::remove_pointer_t<decltype(tensor)>;
    constexpr int rank = tensor_traits<Target>::rank;
    *tensor = to_tensor<rank>(state_dict_entry(fn, sd, prefix + e.name, e.shape), prefix + e.name);
  });
  return p;
}

template <typename T>
void add_layer_state_dict(const char* fn, StateDict<T>& sd, const TransformerLayerParams<T>& p,
                          const TransformerLayerConfig& cfg, const std::string& prefix) {
  for (auto& entry : mha_state_dict(p.self_attn, cfg.attention, prefix + "self_attn.")) sd.insert(std::move(entry));
  const std::vector<LayerStateDictEntry> entries = layer_state_dict_entries(cfg);
  for_each_layer_tensor(p, [&](std::size_t n, const auto* tensor) {
    const LayerStateDictEntry& e = entries[n];
    const std::vector<Index> expected = e.present ? e.shape : std::vector<Index>{0};
    const std::vector<Index> actual(tensor->shape().begin(), tensor->shape().end());
    if (e.present ? actual != expected : tensor->size() != 0)
      throw_shape_error(fn, std::string("params.") + e.name,
                        "expected shape " + dynamic_shape_string(expected) + ", got " + dynamic_shape_string(actual));
    if (e.present) sd[prefix + e.name] = state_dict_array(*tensor);
  });
}

}  // namespace detail

/// \brief Maps the state dict of a PyTorch nn.TransformerEncoderLayer (keys under `prefix`) to TransformerLayerParams.
///
/// Shapes are checked against `cfg` (see the file comment); strict like load_state_dict(strict=True). Throws
/// ShapeError naming the key for a wrong shape, std::invalid_argument for a missing or unexpected key.
/// \code
/// StateDict<float> sd = read_state_dict_safetensors<float>("encoder.safetensors");
/// layer.params() = transformer_layer_params_from_state_dict(sd, layer.config(), "layers.0.");
/// \endcode
template <typename T>
TransformerLayerParams<T> transformer_layer_params_from_state_dict(const StateDict<T>& sd,
                                                                   const TransformerLayerConfig& cfg,
                                                                   const std::string& prefix = "") {
  return detail::layer_params_from_state_dict("transformer_layer_params_from_state_dict", sd, cfg, prefix);
}

/// \brief Loads a state dict into a layer; on error the layer is unchanged.
template <typename T>
void load_state_dict(TransformerLayer<T>& layer, const StateDict<T>& sd, const std::string& prefix = "") {
  layer.params() = transformer_layer_params_from_state_dict(sd, layer.config(), prefix);
}

/// \brief The inverse mapping: a layer's parameters (or gradients) under PyTorch's names. ShapeError naming the
/// parameter whose shape is not the configured one.
/// \code
/// SafetensorsWriter w;
/// for (const auto& [name, array] : transformer_layer_state_dict(layer.params(), layer.config())) w.add(name, array);
/// \endcode
template <typename T>
StateDict<T> transformer_layer_state_dict(const TransformerLayerParams<T>& p, const TransformerLayerConfig& cfg,
                                          const std::string& prefix = "") {
  StateDict<T> sd;
  detail::add_layer_state_dict("transformer_layer_state_dict", sd, p, cfg, prefix);
  return sd;
}

/// \brief Maps the state dict of a PyTorch nn.TransformerEncoder to TransformerStackParams for `cfg`.
///
/// The keys, under `prefix`: those of layer i prefixed with "layers.i." for i = 0 .. N-1 (layers.0.linear1.weight),
/// then norm.weight and norm.bias. Strict: every layer and the final norm exactly as configured.
template <typename T>
TransformerStackParams<T> transformer_stack_params_from_state_dict(const StateDict<T>& sd,
                                                                   const TransformerStackConfig& cfg,
                                                                   const std::string& prefix = "") {
  const char* fn = "transformer_stack_params_from_state_dict";
  const Index e = cfg.layer.attention.embed_dim;
  const bool norm_bias = cfg.final_norm && cfg.layer.bias && cfg.layer.norm == NormKind::layer_norm;
  for (const auto& entry : sd) {  // every key: layers.i.* with i < N, or the final norm's
    if (!detail::has_prefix(entry.first, prefix)) continue;
    const std::string rest = entry.first.substr(prefix.size());
    if ((rest == "norm.weight" && cfg.final_norm) || (rest == "norm.bias" && norm_bias)) continue;
    bool layer_key = false;
    if (detail::has_prefix(rest, "layers.")) {
      const std::size_t dot = rest.find('.', 7);
      const std::string digits = rest.substr(7, dot == std::string::npos ? std::string::npos : dot - 7);
      layer_key = dot != std::string::npos && !digits.empty() && digits.size() < 10 &&
                  std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }) &&
                  std::stoll(digits) < cfg.num_layers;
    }
    if (!layer_key)
      detail::throw_invalid(fn, entry.first,
                            "unexpected key (expected layers.i.* for i < " + std::to_string(cfg.num_layers) +
                                (cfg.final_norm ? ", norm.weight or norm.bias)" : "; the stack has no final norm)"));
  }
  TransformerStackParams<T> p;
  for (Index i = 0; i < cfg.num_layers; ++i)
    p.layers.push_back(detail::layer_params_from_state_dict(fn, sd, cfg.layer, prefix + "layers." + std::to_string(i) + "."));
  if (cfg.final_norm) {
    p.norm_weight = to_tensor<1>(detail::state_dict_entry(fn, sd, prefix + "norm.weight", {e}), prefix + "norm.weight");
    if (norm_bias) p.norm_bias = to_tensor<1>(detail::state_dict_entry(fn, sd, prefix + "norm.bias", {e}), prefix + "norm.bias");
  }
  return p;
}

/// \brief Loads a state dict into a stack; on error the stack is unchanged.
/// \code
/// TransformerStack<double> encoder(cfg);
/// load_state_dict(encoder, read_state_dict_safetensors<double>("encoder.safetensors"));
/// \endcode
template <typename T>
void load_state_dict(TransformerStack<T>& stack, const StateDict<T>& sd, const std::string& prefix = "") {
  stack.params() = transformer_stack_params_from_state_dict(sd, stack.config(), prefix);
}

/// \brief The inverse mapping: a stack's parameters (or gradients) under PyTorch's names.
template <typename T>
StateDict<T> transformer_stack_state_dict(const TransformerStackParams<T>& p, const TransformerStackConfig& cfg,
                                          const std::string& prefix = "") {
  const char* fn = "transformer_stack_state_dict";
  if (static_cast<Index>(p.layers.size()) != cfg.num_layers)
    detail::throw_invalid(fn, "params.layers",
                          "expected " + std::to_string(cfg.num_layers) + " layers, got " + std::to_string(p.layers.size()));
  StateDict<T> sd;
  for (std::size_t i = 0; i < p.layers.size(); ++i)
    detail::add_layer_state_dict(fn, sd, p.layers[i], cfg.layer, prefix + "layers." + std::to_string(i) + ".");
  const Index e = cfg.layer.attention.embed_dim;
  const bool norm_bias = cfg.final_norm && cfg.layer.bias && cfg.layer.norm == NormKind::layer_norm;
  detail::check_shape<1>(fn, "params.norm_weight", p.norm_weight.shape(), {cfg.final_norm ? e : 0});
  detail::check_shape<1>(fn, "params.norm_bias", p.norm_bias.shape(), {norm_bias ? e : 0});
  if (cfg.final_norm) sd[prefix + "norm.weight"] = detail::state_dict_array(p.norm_weight);
  if (norm_bias) sd[prefix + "norm.bias"] = detail::state_dict_array(p.norm_bias);
  return sd;
}

}  // namespace selfattn
