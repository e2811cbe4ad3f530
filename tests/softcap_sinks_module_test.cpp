// cfg.softcap and cfg.sinks on MultiHeadAttention: the module attends with its cap and its learned sink logits
// (params().sinks) in every entry (forward, backward, step, step_tree, attend_memory), the sinks are a parameter with
// a gradient, a name in the parameter list and a key of the state dict; bad configurations are named.
#include <selfattn/selfattn.hpp>

#include "support/compare.hpp"
#include "support/expect_error.hpp"
#include "support/gradcheck.hpp"
#include "support/module_config.hpp"
#include "support/random.hpp"
#include "support/scalars.hpp"

#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

namespace selfattn::test {
namespace {

SELFATTN_SCALAR_TEST_SUITE(SoftcapSinksModuleTest);

// E 16, H 4 over 2 key/value heads, RoPE on half of each head: the module features the two options meet.
template <typename T>
MultiHeadAttention<T> make_module(double softcap, bool sinks, Random& random) {
  MultiHeadAttention<T> mha(ModuleConfig(16, 4).kv_heads(2).rope(2).with_softcap(softcap).with_sinks(sinks), 23);
  randomize_biases(mha, random);
  return mha;
}

// Rows [from, to) of every sequence of x (B, L, E).
template <typename T>
Tensor<T, 3> rows(const Tensor<T, 3>& x, Index from, Index to) {
  Tensor<T, 3> y({x.dim(0), to - from, x.dim(2)});
  for (Index b = 0; b < x.dim(0); ++b)
    for (Index l = from; l < to; ++l)
      for (Index e = 0; e < x.dim(2); ++e) y(b, l - from, e) = x(b, l, e);
  return y;
}

// The module with cfg.softcap and cfg.sinks computes what the same module without them computes when its call's
// options carry the cap and params().sinks: bit for bit, in the forward and in every input gradient.
TYPED_TEST(SoftcapSinksModuleTest, ForwardIsTheAttentionWithTheModulesCapAndSinks) {
  using T = TypeParam;
  Random random(1);
  const MultiHeadAttention<T> with = make_module<T>(1.25, true, random);
  MultiHeadAttention<T> without(ModuleConfig(16, 4).kv_heads(2).rope(2), 23);
  without.params() = with.params();
  without.params().sinks = Tensor<T, 1>();
  const auto x = random.normal_tensor<T, 3>({2, 7, 16}), dout = random.normal_tensor<T, 3>({2, 7, 16});
  AttentionOptions<T> causal;
  causal.causal = Causal::top_left;
  causal.key_lengths = {7, 4};
  AttentionOptions<T> by_hand = causal;
  by_hand.softcap = T(1.25);
  by_hand.sinks.assign(with.params().sinks.data(), with.params().sinks.data() + 4);
  const auto f = with.forward(x, causal);
  const auto expected = without.forward(x, by_hand);
  EXPECT_TRUE(all_close(f.output, expected.output, 0.0));
  const auto g = with.backward(dout, f), expected_g = without.backward(dout, expected);
  EXPECT_TRUE(all_close(g.d_query, expected_g.d_query, 0.0));
  EXPECT_TRUE(all_close(g.params.q_weight, expected_g.params.q_weight, 0.0));
  EXPECT_EQ(g.params.sinks.size(), 4);
  EXPECT_EQ(expected_g.params.sinks.size(), 0);  // sinks passed in the options are constants of the call

  // ... and the cap and the sinks change the output: the test above could not pass by ignoring them.
  const auto plain = without.forward(x, causal);
  EXPECT_FALSE(all_close(f.output, plain.output, 1e-3));
}

// Decoding with a KV cache, in pieces, gives the rows of one causal forward: the cap and the sinks reach the decode
// kernel's paths and the bfloat16 cache's.
TYPED_TEST(SoftcapSinksModuleTest, StepsInPiecesEqualOneCausalForward) {
  using T = TypeParam;
  Random random(2);
  const MultiHeadAttention<T> mha = make_module<T>(0.75, true, random);
  const auto x = random.normal_tensor<T, 3>({2, 9, 16});
  AttentionOptions<T> causal;
  causal.causal = Causal::top_left;
  const auto expected = mha.forward(x, causal).output;
  for (const std::vector<Index>& split : {std::vector<Index>{1, 1, 1, 1, 1, 1, 1, 1, 1}, {4, 3, 2}, {9}}) {
    auto cache = mha.make_cache(2);
    Index at = 0;
    for (Index piece : split) {
      EXPECT_TRUE(
          all_close(mha.step(rows(x, at, at + piece), cache), rows(expected, at, at + piece), default_tolerance<T>()))
          << "piece at " << at;
      at += piece;
    }
  }
  if constexpr (std::is_same_v<T, float>) {  // keys and values in bfloat16: within their rounding
    auto cache = mha.template make_cache<bfloat16>(2);
    for (Index l = 0; l < 9; ++l)
      EXPECT_TRUE(all_close(mha.step(rows(x, l, l + 1), cache), rows(expected, l, l + 1), 2e-2)) << "bf16 row " << l;
  }
}

// A tree of drafts verified in one step equals one-token steps along each draft's path: the sinks count once although
// the step attends to the cache and to the drafts separately.
TYPED_TEST(SoftcapSinksModuleTest, EachDraftOfATreeEqualsStepsAlongItsPath) {
  using T = TypeParam;
  Random random(3);
  const MultiHeadAttention<T> mha = make_module<T>(1.5, true, random);
  auto prefilled = mha.make_cache(2);
  mha.step(random.normal_tensor<T, 3>({2, 5, 16}), prefilled, {}, {5, 3});
  const DraftTree tree{{-1, 0, 0, 1, -1}};
  const auto drafts = random.normal_tensor<T, 3>({2, tree.size(), 16});
  auto tree_cache = prefilled;
  const Tensor<T, 3> y = mha.step_tree(drafts, tree_cache, tree);
  for (Index node = 0; node < tree.size(); ++node) {
    auto path_cache = prefilled;
    Tensor<T, 3> last;
    for (Index draft : tree.path_to(node)) last = mha.step(rows(drafts, draft, draft + 1), path_cache);
    EXPECT_TRUE(all_close(rows(y, node, node + 1), last, default_tolerance<T>())) << "draft " << node;
  }
}

// Every gradient of the module, the sinks' included, against central differences, for self- and cross-attention.
TEST(SoftcapSinksModuleGradients, MatchFiniteDifferences) {
  Random random(4);
  for (bool self_attention : {true, false}) {
    SCOPED_TRACE(self_attention ? "self" : "cross");
    MultiHeadAttention<double> mha = make_module<double>(1.0, true, random);
    auto& p = mha.params();
    auto query = random.normal_tensor<double, 3>({2, 4, 16});
    auto memory = random.normal_tensor<double, 3>({2, 6, 16});
    const auto dout = random.normal_tensor<double, 3>({2, 4, 16});
    AttentionOptions<double> opts;
    opts.causal = self_attention ? Causal::top_left : Causal::none;
    const auto run = [&] {
      return self_attention ? mha.forward(query, opts) : mha.forward(query, memory, memory, opts);
    };
    const auto loss = [&] { return weighted_sum(run().output, dout); };
    const auto g = mha.backward(dout, run());
    expect_gradient("sinks", p.sinks, g.params.sinks, loss);
    expect_gradient("q_weight", p.q_weight, g.params.q_weight, loss);
    expect_gradient("k_weight", p.k_weight, g.params.k_weight, loss);
    expect_gradient("v_bias", p.v_bias, g.params.v_bias, loss);
    expect_gradient("out_weight", p.out_weight, g.params.out_weight, loss);
    Tensor<double, 3> d_query = g.d_query;
    if (self_attention)
      for (Index n = 0; n < d_query.size(); ++n) d_query.data()[n] += g.d_key.data()[n] + g.d_value.data()[n];
    expect_gradient("query", query, d_query, loss);
  }
}

// The sinks train like any other parameter: a name in the parameter list (no weight decay), and the state dict's
// "sinks" key (gpt-oss's name), both ways.
TEST(SoftcapSinksModuleParameters, ListedAndSavedUnderTheirName) {
  Random random(5);
  MultiHeadAttention<float> mha = make_module<float>(0.0, true, random);
  MhaGradients<float> g =
      mha.backward(random.normal_tensor<float, 3>({1, 3, 16}), mha.forward(random.normal_tensor<float, 3>({1, 3, 16})));
  std::vector<ParameterRef<float>> list;
  add_parameters(list, mha.params(), g.params, "attn.");
  bool found = false;
  for (const ParameterRef<float>& ref : list)
    if (ref.name == "attn.sinks") {
      found = true;
      EXPECT_EQ(ref.size, 4);
      EXPECT_FALSE(ref.decay);
      EXPECT_EQ(ref.value, mha.params().sinks.data());
    }
  EXPECT_TRUE(found);

  const StateDict<float> sd = mha_state_dict(mha.params(), mha.config(), "self_attn.");
  ASSERT_EQ(sd.count("self_attn.sinks"), 1U);
  const MhaParams<float> loaded = mha_params_from_state_dict(sd, mha.config(), "self_attn.");
  EXPECT_TRUE(all_close(loaded.sinks, mha.params().sinks, 0.0));
  MultiHeadAttentionConfig without = mha.config();
  without.sinks = false;
  expect_error<std::invalid_argument>([&] { mha_params_from_state_dict(sd, without, "self_attn."); },
                                      {"self_attn.sinks", "cfg.sinks is false"});
}

TEST(SoftcapSinksModuleErrors, BadConfigurationsAndDuplicatesAreNamed) {
  for (double cap : {-1.0, std::numeric_limits<double>::infinity()})
    expect_error<std::invalid_argument>([&] { MultiHeadAttention<float>(ModuleConfig(8, 2).with_softcap(cap)); },
                                        {"cfg.softcap"});
  Random random(6);
  MultiHeadAttention<float> mha = make_module<float>(2.0, true, random);
  const auto x = random.normal_tensor<float, 3>({1, 3, 16});
  AttentionOptions<float> twice;
  twice.softcap = 1.0f;
  expect_error<std::invalid_argument>([&] { mha.forward(x, twice); }, {"opts.softcap", "cfg.softcap"});
  twice = {};
  twice.sinks = {0, 0, 0, 0};
  expect_error<std::invalid_argument>([&] { mha.forward(x, twice); }, {"opts.sinks", "cfg.sinks"});
  auto cache = mha.make_cache(1);
  expect_error<std::invalid_argument>([&] { mha.step(x, cache, twice); }, {"opts.sinks"});
  mha.params().sinks = Tensor<float, 1>({3});
  expect_error<ShapeError>([&] { mha.forward(x); }, {"params().sinks", "expected shape (4), got (3)"});
}

}  // namespace
}  // namespace selfattn::test
