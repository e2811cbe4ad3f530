/// \file
/// PyTorch state dicts: `nn.MultiheadAttention`'s parameter names mapped to and from MhaParams, and state
/// dicts loaded from a directory of `.npy` files named after the keys. (Loading one from a `.safetensors`
/// file is in io/safetensors.hpp, which needs nlohmann/json: `read_state_dict_safetensors`.)
///
/// The names, for a module with embed_dim E, kdim, vdim (PyTorch's `_qkv_same_embed_dim` is kdim == vdim == E):
///
///     in_proj_weight   (3E, E)      q, k, v weights stacked along dim 0      when kdim == vdim == E
///     q_proj_weight    (E, E)       the three separately                     otherwise
///     k_proj_weight    (E, kdim)
///     v_proj_weight    (E, vdim)
///     in_proj_bias     (3E)         q, k, v biases stacked                   when bias
///     out_proj.weight  (E, E)
///     out_proj.bias    (E)                                                   when bias
///
/// With grouped-query heads (num_kv_heads = Hkv < H, which PyTorch's module does not have) the k and v blocks
/// have Hkv * Dh rows instead of E: in_proj_weight is (E + 2 Hkv Dh, E). `bias_k` / `bias_v` (add_bias_kv)
/// have no counterpart here and are rejected; add_zero_attn leaves no trace in a state dict, so it cannot be
/// detected: do not load such a module.
#pragma once

#include <selfattn/errors.hpp>
#include <selfattn/io/npy.hpp>
#include <selfattn/nn/multihead.hpp>
#include <selfattn/tensor.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <filesystem>
#include <map>
#include <stdexcept>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

namespace selfattn {

namespace detail {

struct MhaStateDictShapes {
  Index e = 0, kv = 0, kdim = 0, vdim = 0;
  bool bias = true;
};

// The projection sizes a config implies, with its zero defaults filled in; checks what the mapping needs.
inline MhaStateDictShapes mha_state_dict_shapes(const char* fn, const MultiHeadAttentionConfig& c) {
  if (c.embed_dim < 1) throw_invalid(fn, "cfg.embed_dim", "expected >= 1, got " + std::to_string(c.embed_dim));
  if (c.num_heads < 1 || c.embed_dim % c.num_heads != 0)
    throw_invalid(fn, "cfg.num_heads", "expected a divisor of embed_dim = " + std::to_string(c.embed_dim) + ", got " +
                                           std::to_string(c.num_heads));
  const Index kv_heads = c.num_kv_heads == 0 ? c.num_heads : c.num_kv_heads;
  if (kv_heads < 1 || c.num_heads % kv_heads != 0)
    throw_invalid(fn, "cfg.num_kv_heads", "expected 0 or a divisor of num_heads, got " + std::to_string(c.num_kv_heads));
  if (c.kdim < 0 || c.vdim < 0) throw_invalid(fn, "cfg.kdim / cfg.vdim", "expected >= 0");
  MhaStateDictShapes s;
  s.e = c.embed_dim;
  s.kv = kv_heads * (c.embed_dim / c.num_heads);
  s.kdim = c.kdim == 0 ? c.embed_dim : c.kdim;
  s.vdim = c.vdim == 0 ? c.embed_dim : c.vdim;
  s.bias = c.bias;
  return s;
}

template <typename T>
const NdArray<T>& state_dict_entry(const char* fn, const StateDict<T>& sd, const std::string& key,
                                   const std::vector<Index>& expected) {
  const auto it = sd.find(key);
  if (it == sd.end()) throw_invalid(fn, key, "missing key (expected shape " + dynamic_shape_string(expected) + ")");
  if (it->second.shape != expected)
    throw_shape_error(fn, key,
                      "expected shape " + dynamic_shape_string(expected) + ", got " + dynamic_shape_string(it->second.shape));
  if (static_cast<std::size_t>(checked_element_count(fn, key, it->second.shape)) != it->second.values.size())
    throw_shape_error(fn, key, "shape " + dynamic_shape_string(it->second.shape) + " does not match its " +
                                   std::to_string(it->second.values.size()) + " values");
  return it->second;
}

// Rows [row, row + rows) of a row-major (R, cols) array, as a tensor of rank 2 (cols > 0) or 1 (cols == 0).
template <typename T, int Rank>
Tensor<T, Rank> state_dict_rows(const NdArray<T>& a, Index row, Index rows) {
  const Index cols = Rank == 2 ? a.shape[1] : 1;
  std::array<Index, Rank> shape{};
  shape[0] = rows;
  if constexpr (Rank == 2) shape[1] = cols;
  Tensor<T, Rank> t(shape);
  std::copy(a.values.begin() + row * cols, a.values.begin() + (row + rows) * cols, t.data());
  return t;
}

template <typename T, int Rank>
NdArray<T> state_dict_array(const Tensor<T, Rank>& t) {
  return NdArray<T>{std::vector<Index>(t.shape().begin(), t.shape().end()), std::vector<T>(t.data(), t.data() + t.size())};
}

}  // namespace detail

/// \brief Maps the state dict of a PyTorch `nn.MultiheadAttention` (keys under `prefix`) to MhaParams.
///
/// Shapes are checked against `cfg` (see the file comment for the names); every key under `prefix` must be one
/// of them (strict, like `load_state_dict(strict=True)`), keys outside `prefix` are ignored. Throws
/// ShapeError naming the key for a wrong shape, std::invalid_argument for a missing, unexpected or unsupported
/// key (bias_k / bias_v) or for in_proj_weight and q/k/v_proj_weight together.
/// \code
/// StateDict<float> sd = read_state_dict_safetensors<float>("model.safetensors", "layers.0.self_attn.");
/// MultiHeadAttention<float> mha(cfg);
/// mha.params() = mha_params_from_state_dict(sd, cfg, "layers.0.self_attn.");
/// \endcode
template <typename T>
MhaParams<T> mha_params_from_state_dict(const StateDict<T>& sd, const MultiHeadAttentionConfig& cfg,
                                        const std::string& prefix = "") {
  const char* fn = "mha_params_from_state_dict";
  const detail::MhaStateDictShapes s = detail::mha_state_dict_shapes(fn, cfg);
  const auto key = [&prefix](const char* name) { return prefix + name; };
  const auto has = [&](const char* name) { return sd.count(key(name)) != 0; };

  // "sinks" (H), gpt-oss's name for the sink logits, with cfg.sinks only (nn.MultiheadAttention has none).
  static const char* const known[] = {"in_proj_weight", "q_proj_weight",   "k_proj_weight", "v_proj_weight",
                                      "in_proj_bias",   "out_proj.weight", "out_proj.bias", "sinks"};
  for (const auto& entry : sd) {
    if (!detail::has_prefix(entry.first, prefix)) continue;
    const std::string rest = entry.first.substr(prefix.size());
    if (rest == "bias_k" || rest == "bias_v")
      detail::throw_invalid(fn, entry.first,
                            "unsupported: the module was built with add_bias_kv=True, which MultiHeadAttention does not "
                            "have");
    if (std::none_of(std::begin(known), std::end(known), [&rest](const char* k) { return rest == k; }))
      detail::throw_invalid(fn, entry.first, "unexpected key (not a parameter of nn.MultiheadAttention)");
  }

  MhaParams<T> p;
  const bool stacked = has("in_proj_weight");
  const bool separate = has("q_proj_weight") || has("k_proj_weight") || has("v_proj_weight");
  if (stacked && separate)
    detail::throw_invalid(fn, key("in_proj_weight"), "present together with q_proj_weight / k_proj_weight / v_proj_weight");
  if (stacked) {
    if (s.kdim != s.e || s.vdim != s.e)
      detail::throw_invalid(fn, key("in_proj_weight"),
                            "a stacked projection needs kdim == vdim == embed_dim = " + std::to_string(s.e) +
                                ", but cfg has kdim " + std::to_string(s.kdim) + ", vdim " + std::to_string(s.vdim) +
                                " (PyTorch then stores q_proj_weight, k_proj_weight, v_proj_weight)");
    const NdArray<T>& w = detail::state_dict_entry(fn, sd, key("in_proj_weight"), {s.e + 2 * s.kv, s.e});
    p.q_weight = detail::state_dict_rows<T, 2>(w, 0, s.e);
    p.k_weight = detail::state_dict_rows<T, 2>(w, s.e, s.kv);
    p.v_weight = detail::state_dict_rows<T, 2>(w, s.e + s.kv, s.kv);
  } else if (separate) {
    p.q_weight = to_tensor<2>(detail::state_dict_entry(fn, sd, key("q_proj_weight"), {s.e, s.e}));
    p.k_weight = to_tensor<2>(detail::state_dict_entry(fn, sd, key("k_proj_weight"), {s.kv, s.kdim}));
    p.v_weight = to_tensor<2>(detail::state_dict_entry(fn, sd, key("v_proj_weight"), {s.kv, s.vdim}));
  } else {
    detail::throw_invalid(fn, key("in_proj_weight"),
                          "missing key (and no q_proj_weight, k_proj_weight, v_proj_weight either)");
  }
  p.out_weight = to_tensor<2>(detail::state_dict_entry(fn, sd, key("out_proj.weight"), {s.e, s.e}));

  if (s.bias) {
    const NdArray<T>& b = detail::state_dict_entry(fn, sd, key("in_proj_bias"), {s.e + 2 * s.kv});
    p.q_bias = detail::state_dict_rows<T, 1>(b, 0, s.e);
    p.k_bias = detail::state_dict_rows<T, 1>(b, s.e, s.kv);
    p.v_bias = detail::state_dict_rows<T, 1>(b, s.e + s.kv, s.kv);
    p.out_bias = to_tensor<1>(detail::state_dict_entry(fn, sd, key("out_proj.bias"), {s.e}));
  } else {
    for (const char* name : {"in_proj_bias", "out_proj.bias"})
      if (has(name)) detail::throw_invalid(fn, key(name), "present, but cfg.bias is false");
  }
  if (cfg.sinks)
    p.sinks = to_tensor<1>(detail::state_dict_entry(fn, sd, key("sinks"), {cfg.num_heads}));
  else if (has("sinks"))
    detail::throw_invalid(fn, key("sinks"), "present, but cfg.sinks is false");
  return p;
}

/// \brief Loads a state dict into a module: `mha.params() = mha_params_from_state_dict(sd, mha.config(), prefix)`.
/// On error the module is unchanged.
/// \code
/// MultiHeadAttention<float> mha(cfg);
/// load_state_dict(mha, read_state_dict_safetensors<float>("mha.safetensors"));
/// \endcode
template <typename T>
void load_state_dict(MultiHeadAttention<T>& mha, const StateDict<T>& sd, const std::string& prefix = "") {
  mha.params() = mha_params_from_state_dict(sd, mha.config(), prefix);
}

/// \brief The inverse mapping: MhaParams as the state dict PyTorch's module would have (keys under `prefix`):
/// in_proj_weight when kdim == vdim == embed_dim, else q/k/v_proj_weight; biases when cfg.bias.
/// \code
/// SafetensorsWriter w;
/// for (const auto& [name, array] : mha_state_dict(mha.params(), mha.config())) w.add(name, array);
/// \endcode
template <typename T>
StateDict<T> mha_state_dict(const MhaParams<T>& p, const MultiHeadAttentionConfig& cfg, const std::string& prefix = "") {
  const char* fn = "mha_state_dict";
  const detail::MhaStateDictShapes s = detail::mha_state_dict_shapes(fn, cfg);
  detail::check_shape<2>(fn, "params.q_weight", p.q_weight.shape(), {s.e, s.e});
  detail::check_shape<2>(fn, "params.k_weight", p.k_weight.shape(), {s.kv, s.kdim});
  detail::check_shape<2>(fn, "params.v_weight", p.v_weight.shape(), {s.kv, s.vdim});
  detail::check_shape<2>(fn, "params.out_weight", p.out_weight.shape(), {s.e, s.e});
  const Index nb = s.bias ? 1 : 0;
  detail::check_shape<1>(fn, "params.q_bias", p.q_bias.shape(), {nb * s.e});
  detail::check_shape<1>(fn, "params.k_bias", p.k_bias.shape(), {nb * s.kv});
  detail::check_shape<1>(fn, "params.v_bias", p.v_bias.shape(), {nb * s.kv});
  detail::check_shape<1>(fn, "params.out_bias", p.out_bias.shape(), {nb * s.e});
  detail::check_shape<1>(fn, "params.sinks", p.sinks.shape(), {cfg.sinks ? cfg.num_heads : 0});

  // Stack along dim 0: the row-major values simply concatenate.
  const auto stack = [](std::vector<Index> shape, std::initializer_list<const Tensor<T, 2>*> w2,
                        std::initializer_list<const Tensor<T, 1>*> w1) {
    NdArray<T> a{std::move(shape), {}};
    for (const auto* t : w2) a.values.insert(a.values.end(), t->data(), t->data() + t->size());
    for (const auto* t : w1) a.values.insert(a.values.end(), t->data(), t->data() + t->size());
    return a;
  };
  StateDict<T> sd;
  if (s.kdim == s.e && s.vdim == s.e) {
    sd[prefix + "in_proj_weight"] = stack({s.e + 2 * s.kv, s.e}, {&p.q_weight, &p.k_weight, &p.v_weight}, {});
  } else {
    sd[prefix + "q_proj_weight"] = detail::state_dict_array(p.q_weight);
    sd[prefix + "k_proj_weight"] = detail::state_dict_array(p.k_weight);
    sd[prefix + "v_proj_weight"] = detail::state_dict_array(p.v_weight);
  }
  sd[prefix + "out_proj.weight"] = detail::state_dict_array(p.out_weight);
  if (s.bias) {
    sd[prefix + "in_proj_bias"] = stack({s.e + 2 * s.kv}, {}, {&p.q_bias, &p.k_bias, &p.v_bias});
    sd[prefix + "out_proj.bias"] = detail::state_dict_array(p.out_bias);
  }
  if (cfg.sinks) sd[prefix + "sinks"] = detail::state_dict_array(p.sinks);
  return sd;
}

/// \brief Reads every `<key>.npy` file of a directory whose key starts with `prefix` (e.g. the files
/// `in_proj_weight.npy`, `out_proj.weight.npy`, ...) into a state dict. FormatError for a malformed file,
/// std::runtime_error when the directory cannot be read.
/// \code
/// StateDict<double> sd = read_state_dict_npy_dir<double>("exported/");
/// \endcode
template <typename T>
StateDict<T> read_state_dict_npy_dir(const std::string& directory, const std::string& prefix = "") {
  namespace fs = std::filesystem;
  std::error_code error;
  fs::directory_iterator it(directory, error);
  if (error)
    throw std::runtime_error("[read_state_dict_npy_dir] cannot read directory '" + directory + "': " + error.message());
  StateDict<T> sd;
  for (; it != fs::directory_iterator(); it.increment(error)) {
    if (error) break;
    const fs::path& path = it->path();
    if (path.extension() != ".npy" || !it->is_regular_file()) continue;
    const std::string key = path.stem().string();  // "out_proj.weight.npy" -> "out_proj.weight"
    if (!detail::has_prefix(key, prefix)) continue;
    sd[key] = read_npy_array<T>(path.string());
  }
  if (error)
    throw std::runtime_error("[read_state_dict_npy_dir] error listing '" + directory + "': " + error.message());
  return sd;
}


}  // namespace selfattn
