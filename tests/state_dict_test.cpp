// tests/state_dict_test.cpp — selfattn/io/state_dict.hpp: nn.MultiheadAttention's state-dict names mapped to
// MhaParams and back, the PyTorch module saved by examples/from_pytorch/save_mha.py reproduced from its .npy
// export, and every mapping error naming its key.
#include <selfattn/selfattn.hpp>
#include <selfattn/io/state_dict.hpp>

#include "support/expect_error.hpp"
#include "support/random.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

using namespace selfattn;
using selfattn::test::expect_error;

namespace {

std::string from_pytorch_data(const std::string& name) {
  return std::string(SELFATTN_FIXTURE_DIR) + "/../../examples/from_pytorch/data/" + name;
}

MultiHeadAttentionConfig config(Index e, Index h, Index kv_heads = 0, Index kdim = 0, Index vdim = 0, bool bias = true) {
  MultiHeadAttentionConfig cfg;
  cfg.embed_dim = e;
  cfg.num_heads = h;
  cfg.num_kv_heads = kv_heads;
  cfg.kdim = kdim;
  cfg.vdim = vdim;
  cfg.bias = bias;
  return cfg;
}

template <typename T, int Rank>
bool same(const Tensor<T, Rank>& a, const Tensor<T, Rank>& b) {
  return a.shape() == b.shape() && std::equal(a.data(), a.data() + a.size(), b.data());
}

template <typename T>
void expect_same_params(const MhaParams<T>& a, const MhaParams<T>& b) {
  EXPECT_TRUE(same(a.q_weight, b.q_weight));
  EXPECT_TRUE(same(a.k_weight, b.k_weight));
  EXPECT_TRUE(same(a.v_weight, b.v_weight));
  EXPECT_TRUE(same(a.out_weight, b.out_weight));
  EXPECT_TRUE(same(a.q_bias, b.q_bias));
  EXPECT_TRUE(same(a.k_bias, b.k_bias));
  EXPECT_TRUE(same(a.v_bias, b.v_bias));
  EXPECT_TRUE(same(a.out_bias, b.out_bias));
}

// A module with random biases too (the constructor zeroes them), its state dict, and the config.
struct Case {
  MultiHeadAttentionConfig cfg;
  MultiHeadAttention<double> mha;
  StateDict<double> sd;
};

Case make_case(const MultiHeadAttentionConfig& cfg, const std::string& prefix = "") {
  MultiHeadAttention<double> mha(cfg, 7);
  test::Random random(8);
  for (Tensor<double, 1>* b : {&mha.params().q_bias, &mha.params().k_bias, &mha.params().v_bias, &mha.params().out_bias})
    for (Index n = 0; n < b->size(); ++n) b->data()[n] = random.normal();
  StateDict<double> sd = mha_state_dict(mha.params(), cfg, prefix);
  return Case{cfg, std::move(mha), std::move(sd)};
}

}  // namespace

// ---- PyTorch's module, from the committed .npy export -----------------------------------------------------

TEST(StateDict, PyTorchModuleFromNpyDirectoryReproducesItsOutput) {
  const MultiHeadAttentionConfig cfg = config(32, 4);
  const StateDict<float> sd = read_state_dict_npy_dir<float>(from_pytorch_data("mha_npy"));
  ASSERT_EQ(sd.size(), 4u);
  EXPECT_EQ(sd.at("in_proj_weight").shape, (std::vector<Index>{96, 32}));
  MultiHeadAttention<float> mha(cfg);
  load_state_dict(mha, sd);

  // The split: q, k, v weights are rows [0, 32), [32, 64), [64, 96) of in_proj_weight.
  const NdArray<float>& in = sd.at("in_proj_weight");
  for (Index r = 0; r < 32; ++r)
    for (Index c = 0; c < 32; ++c) {
      ASSERT_EQ(mha.params().q_weight(r, c), in.values[static_cast<std::size_t>(r * 32 + c)]);
      ASSERT_EQ(mha.params().k_weight(r, c), in.values[static_cast<std::size_t>((32 + r) * 32 + c)]);
      ASSERT_EQ(mha.params().v_weight(r, c), in.values[static_cast<std::size_t>((64 + r) * 32 + c)]);
    }
  EXPECT_EQ(mha.params().v_bias(31), sd.at("in_proj_bias").values[95]);

  const Tensor<float, 3> x = read_npy<float, 3>(from_pytorch_data("input.npy"));
  const Tensor<float, 3> expected = read_npy<float, 3>(from_pytorch_data("output.npy"));
  const Tensor<float, 3> y = mha.forward(x).output;
  ASSERT_EQ(y.shape(), expected.shape());
  double worst = 0.0;
  for (Index n = 0; n < y.size(); ++n)
    worst = std::max(worst, std::fabs(static_cast<double>(y.data()[n]) - static_cast<double>(expected.data()[n])));
  EXPECT_LT(worst, 1e-6);
}

TEST(StateDict, NpyDirectoryPrefixAndErrors) {
  EXPECT_EQ(read_state_dict_npy_dir<double>(from_pytorch_data("mha_npy"), "out_proj.").size(), 2u);
  EXPECT_THROW(read_state_dict_npy_dir<double>(from_pytorch_data("no_such_dir")), std::runtime_error);
}

// ---- Round trips: MhaParams -> state dict -> MhaParams ---------------------------------------------------

TEST(StateDict, RoundTripEveryLayout) {
  struct Layout {
    const char* name;
    MultiHeadAttentionConfig cfg;
    std::vector<std::string> keys;
  };
  const std::vector<Layout> layouts = {
      {"stacked", config(12, 3), {"in_proj_bias", "in_proj_weight", "out_proj.bias", "out_proj.weight"}},
      {"kdim/vdim", config(12, 3, 0, 5, 7),
       {"in_proj_bias", "k_proj_weight", "out_proj.bias", "out_proj.weight", "q_proj_weight", "v_proj_weight"}},
      {"grouped-query", config(12, 4, 2), {"in_proj_bias", "in_proj_weight", "out_proj.bias", "out_proj.weight"}},
      {"no bias", config(12, 2, 0, 0, 0, false), {"in_proj_weight", "out_proj.weight"}},
  };
  for (const Layout& layout : layouts) {
    SCOPED_TRACE(layout.name);
    const std::string prefix = "layers.3.self_attn.";
    Case c = make_case(layout.cfg, prefix);
    std::vector<std::string> keys;
    for (const auto& entry : c.sd) keys.push_back(entry.first.substr(prefix.size()));
    EXPECT_EQ(keys, layout.keys);
    c.sd["layers.4.self_attn.in_proj_weight"] = NdArray<double>{{1}, {0.0}};  // outside the prefix: ignored
    MultiHeadAttention<double> loaded(layout.cfg, 99);
    load_state_dict(loaded, c.sd, prefix);
    expect_same_params(loaded.params(), c.mha.params());
  }
  // Grouped-query: in_proj_weight is (E + 2 Hkv Dh, E) = (12 + 2 * 6, 12).
  EXPECT_EQ(make_case(config(12, 4, 2)).sd.at("in_proj_weight").shape, (std::vector<Index>{24, 12}));
}

// ---- Mapping errors name the key ---------------------------------------------------------------------------

TEST(StateDictErrors, MissingKeys) {
  const Case c = make_case(config(8, 2), "attn.");
  for (const char* key : {"attn.in_proj_bias", "attn.out_proj.weight", "attn.out_proj.bias"}) {
    StateDict<double> sd = c.sd;
    sd.erase(key);
    expect_error<std::invalid_argument>([&] { mha_params_from_state_dict(sd, c.cfg, "attn."); }, {key, "missing key"});
  }
  StateDict<double> sd = c.sd;
  sd.erase("attn.in_proj_weight");
  expect_error<std::invalid_argument>([&] { mha_params_from_state_dict(sd, c.cfg, "attn."); },
                                      {"attn.in_proj_weight", "missing key", "q_proj_weight"});
  // The wrong prefix finds nothing.
  expect_error<std::invalid_argument>([&] { mha_params_from_state_dict(c.sd, c.cfg, "other."); }, {"other.in_proj_weight"});
  // Separate projections: all three needed.
  Case kv = make_case(config(8, 2, 0, 3, 4));
  kv.sd.erase("k_proj_weight");
  expect_error<std::invalid_argument>([&] { mha_params_from_state_dict(kv.sd, kv.cfg); }, {"k_proj_weight", "missing key", "(8, 3)"});
}

TEST(StateDictErrors, WrongShapesNameKeyExpectedAndActual) {
  const Case c = make_case(config(8, 2));
  const auto with = [&](const std::string& key, std::vector<Index> shape) {
    StateDict<double> sd = c.sd;
    NdArray<double> a;
    a.shape = shape;
    Index n = 1;
    for (Index e : shape) n *= e;
    a.values.assign(static_cast<std::size_t>(n), 0.0);
    sd[key] = a;
    return sd;
  };
  expect_error<ShapeError>([&] { mha_params_from_state_dict(with("in_proj_weight", {24, 7}), c.cfg); },
                           {"in_proj_weight", "expected shape (24, 8)", "got (24, 7)"});
  expect_error<ShapeError>([&] { mha_params_from_state_dict(with("in_proj_bias", {24, 1}), c.cfg); },
                           {"in_proj_bias", "expected shape (24,)", "got (24, 1)"});
  expect_error<ShapeError>([&] { mha_params_from_state_dict(with("out_proj.weight", {8}), c.cfg); },
                           {"out_proj.weight", "(8, 8)", "got (8,)"});
  // A config that does not match the checkpoint: E = 16 against an E = 8 module.
  expect_error<ShapeError>([&] { mha_params_from_state_dict(c.sd, config(16, 2)); }, {"in_proj_weight", "(48, 16)", "(24, 8)"});
  // Values inconsistent with the shape.
  StateDict<double> sd = c.sd;
  sd["out_proj.bias"].values.pop_back();
  expect_error<ShapeError>([&] { mha_params_from_state_dict(sd, c.cfg); }, {"out_proj.bias", "7 values"});
}

TEST(StateDictErrors, UnsupportedAndUnexpectedKeys) {
  const Case c = make_case(config(8, 2));
  for (const char* key : {"bias_k", "bias_v"}) {
    StateDict<double> sd = c.sd;
    sd[key] = NdArray<double>{{1, 1, 8}, std::vector<double>(8, 0.0)};
    expect_error<std::invalid_argument>([&] { mha_params_from_state_dict(sd, c.cfg); }, {key, "unsupported", "add_bias_kv"});
  }
  StateDict<double> sd = c.sd;
  sd["dropout.p"] = NdArray<double>{{}, {0.1}};
  expect_error<std::invalid_argument>([&] { mha_params_from_state_dict(sd, c.cfg); }, {"dropout.p", "unexpected key"});

  sd = c.sd;
  sd["q_proj_weight"] = NdArray<double>{{8, 8}, std::vector<double>(64, 0.0)};
  expect_error<std::invalid_argument>([&] { mha_params_from_state_dict(sd, c.cfg); }, {"in_proj_weight", "together with"});

  // A stacked in_proj_weight cannot serve kdim != E.
  expect_error<std::invalid_argument>([&] { mha_params_from_state_dict(c.sd, config(8, 2, 0, 5, 0)); },
                                      {"in_proj_weight", "kdim == vdim == embed_dim", "kdim 5"});
  // Biases present for a bias-free config, and missing for a config with biases.
  expect_error<std::invalid_argument>([&] { mha_params_from_state_dict(c.sd, config(8, 2, 0, 0, 0, false)); },
                                      {"in_proj_bias", "cfg.bias is false"});
  const Case no_bias = make_case(config(8, 2, 0, 0, 0, false));
  expect_error<std::invalid_argument>([&] { mha_params_from_state_dict(no_bias.sd, config(8, 2)); }, {"in_proj_bias", "missing key"});
  // Invalid configs are reported as such.
  expect_error<std::invalid_argument>([&] { mha_params_from_state_dict(c.sd, config(8, 3)); }, {"cfg.num_heads"});
}

TEST(StateDictErrors, FailedLoadLeavesTheModuleUnchanged) {
  const Case c = make_case(config(8, 2));
  MultiHeadAttention<double> mha(c.cfg, 5);
  const MhaParams<double> before = mha.params();
  StateDict<double> sd = c.sd;
  sd.erase("out_proj.bias");
  EXPECT_THROW(load_state_dict(mha, sd), std::invalid_argument);
  expect_same_params(mha.params(), before);
}
