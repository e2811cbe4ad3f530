/// \file
/// PyTorch state dicts of nn.TransformerEncoderLayer, nn.TransformerEncoder, nn.TransformerDecoderLayer and
/// nn.TransformerDecoder mapped to and from the parameters of TransformerLayer, TransformerStack,
/// TransformerDecoderLayer and TransformerDecoderStack, so a PyTorch layer, encoder or decoder loads as it is.
///
/// The names of a layer (under a prefix), with E = embed_dim, F = ffn_dim (Fz = 2F for SwiGLU):
///
///     self_attn.in_proj_weight ... self_attn.out_proj.bias    the attention (io/state_dict.hpp)
///     multihead_attn.in_proj_weight ...                       a decoder layer's cross-attention
///     linear1.weight  (Fz, E)      linear1.bias  (Fz)         when cfg.bias
///     linear2.weight  (E, F)       linear2.bias  (E)          when cfg.bias
///     norm1.weight    (E)          norm1.bias    (E)          bias when cfg.bias and LayerNorm
///     norm2.weight    (E)          norm2.bias    (E)
///     norm3.weight    (E)          norm3.bias    (E)          a decoder layer's
///
/// and of a stack: `layers.i.` + a layer's names for i = 0 .. N-1 (`layers.0.linear1.weight`), then `norm.weight`,
/// `norm.bias` (the final norm). Loading is strict, like `load_state_dict(strict=True)`: every key under the prefix
/// must be one of these.
#pragma once

#include <selfattn/errors.hpp>
#include <selfattn/io/npy.hpp>
#include <selfattn/io/state_dict.hpp>
#include <selfattn/nn/activation.hpp>
#include <selfattn/nn/transformer_decoder_layer.hpp>
#include <selfattn/nn/transformer_decoder_stack.hpp>
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

/// The FFN's and the norms' entries of a layer with `norms` norms (2 in an encoder layer, 3 in a decoder layer).
template <typename Config>
std::vector<LayerStateDictEntry> layer_state_dict_entries(const Config& c) {
  const Index e = c.attention.embed_dim, f = c.ffn_dim, fz = activation_input_width(c.activation, f);
  const bool norm_bias = c.bias && c.norm == NormKind::layer_norm;
  std::vector<LayerStateDictEntry> entries = {{"linear1.weight", {fz, e}, true}, {"linear1.bias", {fz}, c.bias},
                                              {"linear2.weight", {e, f}, true},  {"linear2.bias", {e}, c.bias},
                                              {"norm1.weight", {e}, true},       {"norm1.bias", {e}, norm_bias},
                                              {"norm2.weight", {e}, true},       {"norm2.bias", {e}, norm_bias}};
  if constexpr (std::is_same_v<Config, TransformerDecoderLayerConfig>) {
    entries.push_back({"norm3.weight", {e}, true});
    entries.push_back({"norm3.bias", {e}, norm_bias});
  }
  return entries;
}

/// The layer's tensors in the order of layer_state_dict_entries.
template <typename P>
auto layer_tensors(P& p) {
  auto encoder = std::make_tuple(&p.linear1_weight, &p.linear1_bias, &p.linear2_weight, &p.linear2_bias,
                                 &p.norm1_weight, &p.norm1_bias, &p.norm2_weight, &p.norm2_bias);
  if constexpr (is_decoder_params<std::remove_const_t<P>>)
    return std::tuple_cat(encoder, std::make_tuple(&p.norm3_weight, &p.norm3_bias));
  else
    return encoder;
}

/// Calls f(index, tensor pointer) for the layer's tensors, in entry order.
template <typename P, typename F>
void for_each_layer_tensor(P& p, F&& f) {
  std::apply([&](auto*... tensors) {
    std::size_t n = 0;
    (f(n++, tensors), ...);
  }, layer_tensors(p));
}

/// The attentions of a layer: their key prefixes, configurations and parameters.
template <typename P>
struct LayerAttention {
  const char* prefix;
  MultiHeadAttentionConfig config;
  P* params;
};
template <typename P>
std::vector<LayerAttention<MhaParams<P>>> layer_attentions(const TransformerLayerConfig& c,
                                                           TransformerLayerParams<P>& p) {
  return {{"self_attn.", c.attention, &p.self_attn}};
}
template <typename P>
std::vector<LayerAttention<const MhaParams<P>>> layer_attentions(const TransformerLayerConfig& c,
                                                                 const TransformerLayerParams<P>& p) {
  return {{"self_attn.", c.attention, &p.self_attn}};
}
template <typename P>
std::vector<LayerAttention<MhaParams<P>>> layer_attentions(const TransformerDecoderLayerConfig& c,
                                                           TransformerDecoderLayerParams<P>& p) {
  return {{"self_attn.", c.attention, &p.self_attn},
          {"multihead_attn.", decoder_cross_attention_config(c), &p.multihead_attn}};
}
template <typename P>
std::vector<LayerAttention<const MhaParams<P>>> layer_attentions(const TransformerDecoderLayerConfig& c,
                                                                 const TransformerDecoderLayerParams<P>& p) {
  return {{"self_attn.", c.attention, &p.self_attn},
          {"multihead_attn.", decoder_cross_attention_config(c), &p.multihead_attn}};
}

/// Every key under `prefix` must be an attention's (`self_attn.*`, a decoder's `multihead_attn.*`) or one of the
/// layer's own names.
template <typename T, typename Config>
void check_layer_keys(const char* fn, const StateDict<T>& sd, const std::string& prefix,
                      const std::vector<LayerStateDictEntry>& entries) {
  constexpr bool decoder = std::is_same_v<Config, TransformerDecoderLayerConfig>;
  for (const auto& entry : sd) {
    if (!has_prefix(entry.first, prefix)) continue;
    const std::string rest = entry.first.substr(prefix.size());
    // an attention's keys are checked by mha_params_from_state_dict
    if (has_prefix(rest, "self_attn.") || (decoder && has_prefix(rest, "multihead_attn."))) continue;
    const bool known = std::any_of(entries.begin(), entries.end(), [&](const LayerStateDictEntry& e) {
      return e.present && rest == e.name;
    });
    if (!known) {
      const bool absent = std::any_of(entries.begin(), entries.end(), [&](const LayerStateDictEntry& e) { return rest == e.name; });
      throw_invalid(fn, entry.first,
                    absent    ? "present, but the configuration has no such parameter (cfg.bias false, or RMSNorm)"
                    : decoder ? "unexpected key (not a parameter of nn.TransformerDecoderLayer)"
                              : "unexpected key (not a parameter of nn.TransformerEncoderLayer)");
    }
  }
}

template <typename T, typename Config>
auto layer_params_from_state_dict(const char* fn, const StateDict<T>& sd, const Config& cfg,
                                  const std::string& prefix) {
  const std::vector<LayerStateDictEntry> entries = layer_state_dict_entries(cfg);
  check_layer_keys<T, Config>(fn, sd, prefix, entries);
  std::conditional_t<std::is_same_v<Config, TransformerDecoderLayerConfig>, TransformerDecoderLayerParams<T>,
                     TransformerLayerParams<T>>
      p;
  for (const LayerAttention<MhaParams<T>>& a : layer_attentions(cfg, p))
    *a.params = mha_params_from_state_dict(sd, a.config, prefix + a.prefix);
  for_each_layer_tensor(p, [&](std::size_t n, auto* tensor) {
    const LayerStateDictEntry& e = entries[n];
    if (!e.present) return;
    using Target = std::remove_pointer_t<decltype(tensor)>;
    constexpr int rank = tensor_traits<Target>::rank;
    *tensor = to_tensor<rank>(state_dict_entry(fn, sd, prefix + e.name, e.shape), prefix + e.name);
  });
  return p;
}

template <typename T, typename Params, typename Config>
void add_layer_state_dict(const char* fn, StateDict<T>& sd, const Params& p, const Config& cfg,
                          const std::string& prefix) {
  for (const LayerAttention<const MhaParams<T>>& a : layer_attentions(cfg, p))
    for (auto& entry : mha_state_dict(*a.params, a.config, prefix + a.prefix)) sd.insert(std::move(entry));
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

namespace detail {

/// A stack's parameters from a state dict: StackParams (TransformerStackParams or TransformerDecoderStackParams) for
/// `cfg`, every key under `prefix` a layer's (layers.i.* with i < N) or the final norm's.
template <typename StackParams, typename T, typename Config>
StackParams stack_params_from_state_dict(const char* fn, const StateDict<T>& sd, const Config& cfg,
                                         const std::string& prefix) {
  const Index e = cfg.layer.attention.embed_dim;
  const bool norm_bias = cfg.final_norm && cfg.layer.bias && cfg.layer.norm == NormKind::layer_norm;
  for (const auto& entry : sd) {  // every key: layers.i.* with i < N, or the final norm's
    if (!has_prefix(entry.first, prefix)) continue;
    const std::string rest = entry.first.substr(prefix.size());
    if ((rest == "norm.weight" && cfg.final_norm) || (rest == "norm.bias" && norm_bias)) continue;
    bool layer_key = false;
    if (has_prefix(rest, "layers.")) {
      const std::size_t dot = rest.find('.', 7);
      const std::string digits = rest.substr(7, dot == std::string::npos ? std::string::npos : dot - 7);
      layer_key = dot != std::string::npos && !digits.empty() && digits.size() < 10 &&
                  std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }) &&
                  std::stoll(digits) < cfg.num_layers;
    }
    if (!layer_key)
      throw_invalid(fn, entry.first,
                    "unexpected key (expected layers.i.* for i < " + std::to_string(cfg.num_layers) +
                        (cfg.final_norm ? ", norm.weight or norm.bias)" : "; the stack has no final norm)"));
  }
  StackParams p;
  for (Index i = 0; i < cfg.num_layers; ++i)
    p.layers.push_back(layer_params_from_state_dict(fn, sd, cfg.layer, prefix + "layers." + std::to_string(i) + "."));
  if (cfg.final_norm) {
    p.norm_weight = to_tensor<1>(state_dict_entry(fn, sd, prefix + "norm.weight", {e}), prefix + "norm.weight");
    if (norm_bias)
      p.norm_bias = to_tensor<1>(state_dict_entry(fn, sd, prefix + "norm.bias", {e}), prefix + "norm.bias");
  }
  return p;
}

/// The inverse mapping of stack_params_from_state_dict.
template <typename T, typename StackParams, typename Config>
StateDict<T> stack_state_dict(const char* fn, const StackParams& p, const Config& cfg, const std::string& prefix) {
  if (static_cast<Index>(p.layers.size()) != cfg.num_layers)
    throw_invalid(fn, "params.layers",
                  "expected " + std::to_string(cfg.num_layers) + " layers, got " + std::to_string(p.layers.size()));
  StateDict<T> sd;
  for (std::size_t i = 0; i < p.layers.size(); ++i)
    add_layer_state_dict(fn, sd, p.layers[i], cfg.layer, prefix + "layers." + std::to_string(i) + ".");
  const Index e = cfg.layer.attention.embed_dim;
  const bool norm_bias = cfg.final_norm && cfg.layer.bias && cfg.layer.norm == NormKind::layer_norm;
  check_shape<1>(fn, "params.norm_weight", p.norm_weight.shape(), {cfg.final_norm ? e : 0});
  check_shape<1>(fn, "params.norm_bias", p.norm_bias.shape(), {norm_bias ? e : 0});
  if (cfg.final_norm) sd[prefix + "norm.weight"] = state_dict_array(p.norm_weight);
  if (norm_bias) sd[prefix + "norm.bias"] = state_dict_array(p.norm_bias);
  return sd;
}

}  // namespace detail

/// \brief Maps the state dict of a PyTorch nn.TransformerEncoder to TransformerStackParams for `cfg`.
///
/// The keys, under `prefix`: those of layer i prefixed with "layers.i." for i = 0 .. N-1 (layers.0.linear1.weight),
/// then norm.weight and norm.bias. Strict: every layer and the final norm exactly as configured.
template <typename T>
TransformerStackParams<T> transformer_stack_params_from_state_dict(const StateDict<T>& sd,
                                                                   const TransformerStackConfig& cfg,
                                                                   const std::string& prefix = "") {
  return detail::stack_params_from_state_dict<TransformerStackParams<T>>("transformer_stack_params_from_state_dict", sd,
                                                                         cfg, prefix);
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
  return detail::stack_state_dict<T>("transformer_stack_state_dict", p, cfg, prefix);
}

/// \brief Maps the state dict of a PyTorch nn.TransformerDecoderLayer (keys under `prefix`) to
/// TransformerDecoderLayerParams: self_attn.*, multihead_attn.*, linear1/linear2 and norm1..norm3 (the file comment).
/// Strict, with the errors of transformer_layer_params_from_state_dict.
/// \code
/// decoder.params() = transformer_decoder_layer_params_from_state_dict(sd, decoder.config(), "layers.0.");
/// \endcode
template <typename T>
TransformerDecoderLayerParams<T> transformer_decoder_layer_params_from_state_dict(
    const StateDict<T>& sd, const TransformerDecoderLayerConfig& cfg, const std::string& prefix = "") {
  return detail::layer_params_from_state_dict("transformer_decoder_layer_params_from_state_dict", sd, cfg, prefix);
}

/// \brief Loads a state dict into a decoder layer; on error the layer is unchanged.
template <typename T>
void load_state_dict(TransformerDecoderLayer<T>& layer, const StateDict<T>& sd, const std::string& prefix = "") {
  layer.params() = transformer_decoder_layer_params_from_state_dict(sd, layer.config(), prefix);
}

/// \brief The inverse mapping: a decoder layer's parameters (or gradients) under PyTorch's names.
template <typename T>
StateDict<T> transformer_decoder_layer_state_dict(const TransformerDecoderLayerParams<T>& p,
                                                  const TransformerDecoderLayerConfig& cfg,
                                                  const std::string& prefix = "") {
  StateDict<T> sd;
  detail::add_layer_state_dict("transformer_decoder_layer_state_dict", sd, p, cfg, prefix);
  return sd;
}

/// \brief Maps the state dict of a PyTorch nn.TransformerDecoder (layers.i.* as a decoder layer's, norm.weight,
/// norm.bias) to TransformerDecoderStackParams for `cfg`; strict.
template <typename T>
TransformerDecoderStackParams<T> transformer_decoder_stack_params_from_state_dict(
    const StateDict<T>& sd, const TransformerDecoderStackConfig& cfg, const std::string& prefix = "") {
  return detail::stack_params_from_state_dict<TransformerDecoderStackParams<T>>(
      "transformer_decoder_stack_params_from_state_dict", sd, cfg, prefix);
}

/// \brief Loads a state dict into a decoder stack; on error the stack is unchanged.
template <typename T>
void load_state_dict(TransformerDecoderStack<T>& stack, const StateDict<T>& sd, const std::string& prefix = "") {
  stack.params() = transformer_decoder_stack_params_from_state_dict(sd, stack.config(), prefix);
}

/// \brief The inverse mapping: a decoder stack's parameters (or gradients) under PyTorch's names.
template <typename T>
StateDict<T> transformer_decoder_stack_state_dict(const TransformerDecoderStackParams<T>& p,
                                                  const TransformerDecoderStackConfig& cfg,
                                                  const std::string& prefix = "") {
  return detail::stack_state_dict<T>("transformer_decoder_stack_state_dict", p, cfg, prefix);
}

}  // namespace selfattn
