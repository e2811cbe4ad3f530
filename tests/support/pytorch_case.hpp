// tests/support/pytorch_case.hpp — one PyTorch nn.MultiheadAttention fixture as a ready module: the
// parameters loaded, the options (masks) built, the inputs read. Shared by the forward and backward
// conformance tests.
#pragma once

#include <selfattn/selfattn.hpp>

#include "fixture.hpp"

#include <string>

namespace selfattn::test {

struct PyTorchCase {
  Fixture fx;
  MultiHeadAttention<double> mha;
  Tensor<bool, 4> allowed;  // owned here: opts points into them
  Tensor<double, 4> bias;
  AttentionOptions<double> opts;
  Tensor<double, 3> query, key, value;
  bool self_attention;

  explicit PyTorchCase(const std::string& name)
      : fx(load_fixture(fixture_path("mha_" + name + ".txt"))), mha(config(fx)) {
    auto& p = mha.params();
    p.q_weight = fx.tensor<2>("q_weight");
    p.k_weight = fx.tensor<2>("k_weight");
    p.v_weight = fx.tensor<2>("v_weight");
    p.out_weight = fx.tensor<2>("out_weight");
    if (mha.config().bias) {
      p.q_bias = fx.tensor<1>("q_bias");
      p.k_bias = fx.tensor<1>("k_bias");
      p.v_bias = fx.tensor<1>("v_bias");
      p.out_bias = fx.tensor<1>("out_bias");
    }
    if (fx.integer("causal") == 1) opts.causal = Causal::top_left;
    if (fx.has("key_lengths")) opts.key_lengths = fx.indices("key_lengths");
    if (fx.has("allowed")) opts.allowed = allowed = fx.tensor<4, bool>("allowed");
    if (fx.has("bias_mask")) opts.bias = bias = fx.tensor<4>("bias_mask");
    query = fx.tensor<3>("query");
    key = fx.tensor<3>("key");
    value = fx.tensor<3>("value");
    self_attention = fx.integer("self_attention") != 0;
  }

  // A case holds views into itself (opts -> allowed, bias): it must not be copied or moved.
  PyTorchCase(const PyTorchCase&) = delete;
  PyTorchCase& operator=(const PyTorchCase&) = delete;

 private:
  static MultiHeadAttentionConfig config(const Fixture& fx) {
    MultiHeadAttentionConfig cfg;
    cfg.embed_dim = fx.integer("embed_dim");
    cfg.num_heads = fx.integer("num_heads");
    cfg.kdim = fx.integer("kdim");
    cfg.vdim = fx.integer("vdim");
    cfg.bias = fx.integer("bias") != 0;
    return cfg;
  }
};

}  // namespace selfattn::test
