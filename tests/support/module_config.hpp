// tests/support/module_config.hpp — a module's configuration in one expression, and random biases for it, for the
// tests that build MultiHeadAttention from a table of cases:
//
//   MultiHeadAttention<T> mha(test::ModuleConfig(c.E, c.H).kv_heads(c.Hkv).rope(c.rope_dim, c.style), 7);
//   test::randomize_biases(mha, random);
#pragma once

#include <selfattn/selfattn.hpp>

#include "support/random.hpp"

namespace selfattn::test {

/// MultiHeadAttentionConfig with setters that chain; a field no setter names keeps the library's default.
struct ModuleConfig : MultiHeadAttentionConfig {
  ModuleConfig(Index embed, Index heads) {
    embed_dim = embed;
    num_heads = heads;
  }
  ModuleConfig& kv_heads(Index heads) {
    num_kv_heads = heads;
    return *this;
  }
  /// Key and value input widths (0: embed_dim).
  ModuleConfig& input_dims(Index key, Index value) {
    kdim = key;
    vdim = value;
    return *this;
  }
  ModuleConfig& rope(Index dim, RopeStyle style = RopeStyle::half) {
    rope_dim = dim;
    rope_style = style;
    return *this;
  }
  ModuleConfig& with_alibi(bool on) {
    alibi = on;
    return *this;
  }
  ModuleConfig& with_bias(bool on) {
    bias = on;
    return *this;
  }
  ModuleConfig& with_dropout(double probability) {
    dropout = probability;
    return *this;
  }
  ModuleConfig& with_softcap(double cap) {
    softcap = cap;
    return *this;
  }
  ModuleConfig& with_sinks(bool on) {
    sinks = on;
    return *this;
  }
};

/// Normal random q, k, v and out biases (in that order) where the module has biases, then sink logits where it has
/// them; nothing drawn where it has none.
template <typename T>
void randomize_biases(MultiHeadAttention<T>& mha, Random& random) {
  auto& p = mha.params();
  if (mha.config().bias)
    for (Tensor<T, 1>* b : {&p.q_bias, &p.k_bias, &p.v_bias, &p.out_bias}) *b = random.normal_tensor<T, 1>(b->shape());
  if (mha.config().sinks) p.sinks = random.normal_tensor<T, 1>(p.sinks.shape());
}

}  // namespace selfattn::test
