// tests/support/layer_params.hpp — every tensor of a layer's (or stack's) parameters beside its gradient, by name,
// so one loop checks them all:
//
//   for_each_layer_param(layer.params(), g.params, [&](const std::string& name, auto& param, const auto& grad) {
//     EXPECT_TRUE(all_close(grad, numerical_gradient(param, loss), 1e-7)) << name;
//   });
#pragma once

#include <selfattn/selfattn.hpp>

#include "random.hpp"

#include <string>

namespace selfattn::test {

template <typename P, typename G, typename F>
void for_each_mha_param(const std::string& prefix, P& p, G& g, F&& f) {
  f(prefix + "q_weight", p.q_weight, g.q_weight);
  f(prefix + "k_weight", p.k_weight, g.k_weight);
  f(prefix + "v_weight", p.v_weight, g.v_weight);
  f(prefix + "out_weight", p.out_weight, g.out_weight);
  f(prefix + "q_bias", p.q_bias, g.q_bias);
  f(prefix + "k_bias", p.k_bias, g.k_bias);
  f(prefix + "v_bias", p.v_bias, g.v_bias);
  f(prefix + "out_bias", p.out_bias, g.out_bias);
}

template <typename P, typename G, typename F>
void for_each_layer_param(P& p, G& g, F&& f, const std::string& prefix = "") {
  for_each_mha_param(prefix + "self_attn.", p.self_attn, g.self_attn, f);
  f(prefix + "linear1_weight", p.linear1_weight, g.linear1_weight);
  f(prefix + "linear1_bias", p.linear1_bias, g.linear1_bias);
  f(prefix + "linear2_weight", p.linear2_weight, g.linear2_weight);
  f(prefix + "linear2_bias", p.linear2_bias, g.linear2_bias);
  f(prefix + "norm1_weight", p.norm1_weight, g.norm1_weight);
  f(prefix + "norm1_bias", p.norm1_bias, g.norm1_bias);
  f(prefix + "norm2_weight", p.norm2_weight, g.norm2_weight);
  f(prefix + "norm2_bias", p.norm2_bias, g.norm2_bias);
}

/// A decoder layer's: the encoder layer's tensors (self-attention, FFN, norm1, norm2), the cross-attention's, norm3.
template <typename P, typename G, typename F>
void for_each_decoder_layer_param(P& p, G& g, F&& f, const std::string& prefix = "") {
  for_each_layer_param(p, g, f, prefix);
  for_each_mha_param(prefix + "multihead_attn.", p.multihead_attn, g.multihead_attn, f);
  f(prefix + "norm3_weight", p.norm3_weight, g.norm3_weight);
  f(prefix + "norm3_bias", p.norm3_bias, g.norm3_bias);
}

/// Every tensor of an encoder or a decoder layer's parameters, beside the same tensor of `g`.
template <typename T, typename G, typename F>
void for_each_param(TransformerLayerParams<T>& p, G& g, F&& f, const std::string& prefix = "") {
  for_each_layer_param(p, g, f, prefix);
}
template <typename T, typename G, typename F>
void for_each_param(TransformerDecoderLayerParams<T>& p, G& g, F&& f, const std::string& prefix = "") {
  for_each_decoder_layer_param(p, g, f, prefix);
}

/// Uniform values in [-0.8, 0.8] for every parameter of a layer: the initialisation leaves biases 0 and norm weights
/// 1, which would hide mistakes.
template <typename P>
void randomize_layer(P& params, Random& rng) {
  P unused = params;
  for_each_param(params, unused, [&](const std::string&, auto& p, auto&) {
    for (Index n = 0; n < p.size(); ++n) p.data()[n] = rng.uniform(-0.8, 0.8);
  });
}

template <typename P, typename G, typename F>
void for_each_stack_param(P& p, G& g, F&& f) {
  for (std::size_t i = 0; i < p.layers.size(); ++i)
    for_each_layer_param(p.layers[i], g.layers[i], f, "layers." + std::to_string(i) + ".");
  f(std::string("norm_weight"), p.norm_weight, g.norm_weight);
  f(std::string("norm_bias"), p.norm_bias, g.norm_bias);
}

}  // namespace selfattn::test
