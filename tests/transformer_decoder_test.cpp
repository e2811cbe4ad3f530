// Tests of TransformerDecoderLayer and of the module entries it decodes with (MultiHeadAttention::project_memory and
// attend_memory): conformance with PyTorch's nn.TransformerDecoderLayer (fixtures written by
// tests/pytorch/make_decoder_fixtures.py: the output, the gradients of the target, the memory and every parameter, in
// double within 1e-10 and float within 1e-4), every gradient by central finite differences in double (dropout on
// included), decoding in pieces against the forward, and bad arguments that throw naming themselves.
#include <selfattn/io/transformer_state_dict.hpp>
#include <selfattn/selfattn.hpp>

#include "support/compare.hpp"
#include "support/expect_error.hpp"
#include "support/fixture.hpp"
#include "support/gradcheck.hpp"
#include "support/layer_params.hpp"
#include "support/random.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace selfattn::test {
namespace {

// ---- PyTorch conformance ----------------------------------------------------------------------------

TransformerDecoderLayerConfig fixture_config(const Fixture& fx) {
  TransformerDecoderLayerConfig cfg;
  cfg.attention.embed_dim = fx.integer("embed_dim");
  cfg.attention.num_heads = fx.integer("num_heads");
  cfg.attention.dropout = 0.0;
  cfg.ffn_dim = fx.integer("ffn_dim");
  const Index activation = fx.integer("activation");  // codes of make_layer_fixtures.py
  cfg.activation = activation == 0 ? Activation::relu : activation == 1 ? Activation::gelu : Activation::gelu_tanh;
  cfg.dropout = 0.0;
  cfg.norm_first = fx.integer("norm_first") != 0;
  cfg.norm_eps = fx.values("norm_eps").at(0);
  cfg.causal = fx.integer("causal") != 0;  // PyTorch's tgt_mask: top-left causal, or none
  return cfg;
}

template <typename T>
StateDict<T> fixture_parameters(const Fixture& fx) {
  StateDict<T> sd;
  for (const auto& [name, entry] : fx.tensors) {
    if (name.find('.') == std::string::npos || name.rfind("grad.", 0) == 0) continue;  // data, results, gradients
    NdArray<T> a{entry.shape, std::vector<T>(entry.values.begin(), entry.values.end())};
    sd[name] = std::move(a);
  }
  return sd;
}

template <typename T, int Rank>
void expect_matches(const Fixture& fx, const std::string& name, const Tensor<T, Rank>& actual, double tolerance) {
  const Tensor<double, Rank> expected = fx.tensor<Rank>(name);
  EXPECT_TRUE(all_close(actual, expected, tolerance)) << name;
}

template <typename T>
void expect_matches(const Fixture& fx, const std::string& name, const NdArray<T>& actual, double tolerance) {
  const Fixture::Entry& e = fx.tensors.at(name);
  ASSERT_EQ(actual.shape, e.shape) << name;
  const auto count = static_cast<Index>(e.values.size());
  Tensor<T, 1> a({count});
  Tensor<double, 1> expected({count});
  std::copy(actual.values.begin(), actual.values.end(), a.data());
  std::copy(e.values.begin(), e.values.end(), expected.data());
  EXPECT_TRUE(all_close(a, expected, tolerance)) << name;
}

template <typename T>
StateDict<T> state_dict_of(const TransformerDecoderLayerParams<T>& p, const TransformerDecoderLayerConfig& cfg) {
  return transformer_decoder_layer_state_dict(p, cfg);
}

template <typename T>
StateDict<T> state_dict_of(const TransformerDecoderStackParams<T>& p, const TransformerDecoderStackConfig& cfg) {
  return transformer_decoder_stack_state_dict(p, cfg);
}

// Loads a fixture into a Model (TransformerDecoderLayer<T> or TransformerDecoderStack<T>) of configuration `cfg`,
// runs forward and backward, and compares the output and the gradients of x, the memory and every parameter by
// PyTorch's names.
template <typename T, typename Model, typename Config>
void run_fixture(const Fixture& fx, const Config& cfg, double tolerance) {
  Model model(cfg);
  const StateDict<T> parameters = fixture_parameters<T>(fx);
  load_state_dict(model, parameters);
  const StateDict<T> saved = state_dict_of(model.params(), model.config());
  ASSERT_EQ(saved.size(), parameters.size()) << "a load and save keeps every name";
  for (const auto& [name, array] : parameters) EXPECT_TRUE(saved.at(name).values == array.values) << name;

  AttentionOptions<T> opts, memory_opts;
  if (fx.has("key_lengths")) opts.key_lengths = fx.indices("key_lengths");
  if (fx.has("memory_key_lengths")) memory_opts.key_lengths = fx.indices("memory_key_lengths");
  const auto f = model.forward(fx.tensor<3, T>("x"), fx.tensor<3, T>("memory"), opts, memory_opts);
  const auto g = model.backward(fx.tensor<3, T>("dout"), f);
  expect_matches(fx, "output", f.output, tolerance);
  expect_matches(fx, "grad.x", g.d_input, tolerance);
  expect_matches(fx, "grad.memory", g.d_memory, tolerance);
  const StateDict<T> gradients = state_dict_of(g.params, model.config());
  EXPECT_EQ(gradients.size(), parameters.size());
  for (const auto& [name, array] : gradients) expect_matches(fx, "grad." + name, array, tolerance);
}

template <typename T>
void run_fixture(const std::string& case_name, const Fixture& fx, double tolerance) {
  if (case_name.rfind("stack_", 0) == 0) {
    TransformerDecoderStackConfig cfg;
    cfg.layer = fixture_config(fx);
    cfg.num_layers = fx.integer("num_layers");
    cfg.final_norm = fx.integer("final_norm") != 0;
    run_fixture<T, TransformerDecoderStack<T>>(fx, cfg, tolerance);
  } else {
    run_fixture<T, TransformerDecoderLayer<T>>(fx, fixture_config(fx), tolerance);
  }
}

class DecoderPyTorchConformance : public ::testing::TestWithParam<std::string> {};

TEST_P(DecoderPyTorchConformance, OutputAndEveryGradientMatchPyTorch) {
  const Fixture fx = load_fixture(fixture_path("decoder_" + GetParam() + ".txt"));
  {
    SCOPED_TRACE("double");
    run_fixture<double>(GetParam(), fx, 1e-10);
  }
  {
    SCOPED_TRACE("float");
    run_fixture<float>(GetParam(), fx, 1e-4);
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, DecoderPyTorchConformance,
                         ::testing::Values("post_relu_memory_padding", "pre_gelu_padding",
                                           "post_gelu_tanh_eps_unmasked", "pre_relu_long_memory",
                                           "stack_pre_final_norm", "stack_post"),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

// ---- Gradients and decoding -------------------------------------------------------------------------

struct DecoderCase {
  std::string name;
  TransformerDecoderLayerConfig cfg;
  AttentionOptions<double> opts, memory_opts;
  bool training = false;
};

TransformerDecoderLayerConfig small_decoder_config() {
  TransformerDecoderLayerConfig cfg;
  cfg.attention.embed_dim = 8;
  cfg.attention.num_heads = 2;
  cfg.memory_dim = 6;
  cfg.ffn_dim = 6;
  cfg.dropout = 0.0;
  return cfg;
}

std::vector<DecoderCase> decoder_cases() {
  std::vector<DecoderCase> cases;
  {
    DecoderCase c{"post-norm relu, source padding", small_decoder_config(), {}, {}};
    c.memory_opts.key_lengths = {5, 2};
    cases.push_back(c);
  }
  {
    DecoderCase c{
        "pre-norm RMSNorm SwiGLU, GQA, RoPE, no biases, target and source padding", small_decoder_config(), {}, {}};
    c.cfg.norm_first = true;
    c.cfg.norm = NormKind::rms_norm;
    c.cfg.activation = Activation::swiglu;
    c.cfg.attention.num_heads = 4;
    c.cfg.attention.num_kv_heads = 2;
    c.cfg.attention.rope_dim = 2;
    c.cfg.attention.bias = false;
    c.cfg.bias = false;
    c.opts.key_lengths = {4, 3};
    c.memory_opts.key_lengths = {3, 5};
    cases.push_back(c);
  }
  for (bool norm_first : {false, true}) {
    DecoderCase c{std::string(norm_first ? "pre" : "post") + "-norm in training: dropout everywhere",
                  small_decoder_config(),
                  {},
                  {},
                  true};
    c.cfg.norm_first = norm_first;
    c.cfg.dropout = 0.25;
    c.cfg.attention.dropout = 0.2;
    c.opts.seed = 1234;
    c.memory_opts.seed = 99;
    cases.push_back(c);
  }
  return cases;
}

TEST(TransformerDecoderLayerTest, EveryGradientMatchesFiniteDifferences) {
  for (const DecoderCase& c : decoder_cases()) {
    SCOPED_TRACE(c.name);
    TransformerDecoderLayer<double> layer(c.cfg, 21);
    layer.set_training(c.training);
    Random rng(22);
    randomize_layer(layer.params(), rng);
    Tensor<double, 3> x = rng.normal_tensor<double, 3>({2, 4, 8});
    Tensor<double, 3> memory = rng.normal_tensor<double, 3>({2, 5, 6});
    const Tensor<double, 3> weights = rng.normal_tensor<double, 3>({2, 4, 8});
    const auto loss = [&] { return weighted_sum(layer.forward(x, memory, c.opts, c.memory_opts).output, weights); };
    const TransformerDecoderLayerGradients<double> g =
        layer.backward(weights, layer.forward(x, memory, c.opts, c.memory_opts));
    expect_gradient("x", x, g.d_input, loss);
    expect_gradient("memory", memory, g.d_memory, loss);
    for_each_decoder_layer_param(layer.params(), g.params, [&](const std::string& name, auto& param, const auto& grad) {
      expect_gradient(name, param, grad, loss);
    });
  }
}

TEST(TransformerDecoderLayerTest, StepInPiecesEqualsTheForward) {
  for (const DecoderCase& c : decoder_cases()) {
    if (c.training) continue;  // step applies no dropout
    SCOPED_TRACE(c.name);
    TransformerDecoderLayer<double> layer(c.cfg, 23);
    Random rng(24);
    randomize_layer(layer.params(), rng);
    const Tensor<double, 3> x = rng.normal_tensor<double, 3>({2, 7, 8});
    const Tensor<double, 3> memory = rng.normal_tensor<double, 3>({2, 5, 6});
    const Tensor<double, 3> full = layer.forward(x, memory, {}, c.memory_opts).output;
    KVCache<double> cache = layer.make_cache(2);
    const MemoryKeysValues<double> source = layer.project_memory(memory);
    Index done = 0;
    for (Index piece : {3, 1, 1, 2}) {
      const TensorView<const double, 3> part(x.data() + done * 8, {2, piece, 8}, {56, 8, 1});
      const Tensor<double, 3> y = layer.step(part, cache, source, {}, c.memory_opts);
      const TensorView<const double, 3> expected(full.data() + done * 8, {2, piece, 8}, {56, 8, 1});
      EXPECT_TRUE(all_close(y, expected, 1e-12)) << "rows " << done << " to " << done + piece - 1;
      done += piece;
    }
    EXPECT_EQ(cache.length(), 7);
  }
}

TEST(TransformerDecoderLayerTest, WeightsOfBothAttentionsWhenAsked) {
  TransformerDecoderLayer<float> layer(small_decoder_config());
  Tensor<float, 3> x({1, 3, 8}), memory({1, 4, 6});
  AttentionOptions<float> opts, memory_opts;
  opts.need_weights = true;
  memory_opts.need_weights = true;
  memory_opts.key_lengths = {2};
  const auto f = layer.forward(x, memory, opts, memory_opts);
  ASSERT_EQ(f.self_weights.shape(), (std::array<Index, 4>{1, 2, 3, 3}));
  ASSERT_EQ(f.cross_weights.shape(), (std::array<Index, 4>{1, 2, 3, 4}));
  EXPECT_EQ(f.self_weights(0, 1, 0, 2), 0.0f) << "cfg.causal: row 0 sees key 0 only";
  EXPECT_EQ(f.cross_weights(0, 0, 2, 3), 0.0f) << "source padding: key 3 is past length 2";
  EXPECT_GT(f.cross_weights(0, 0, 0, 1), 0.0f) << "the memory is not causal";
  EXPECT_EQ(layer.forward(x, memory).cross_weights.size(), 0);
}

TEST(TransformerDecoderLayerTest, ForwardKeepsTemporaryInputsForBackward) {
  TransformerDecoderLayer<double> layer(small_decoder_config());
  Random rng(25);
  const Tensor<double, 3> x = rng.normal_tensor<double, 3>({1, 5, 8});
  const Tensor<double, 3> memory = rng.normal_tensor<double, 3>({1, 3, 6});
  const Tensor<double, 3> dout = rng.normal_tensor<double, 3>({1, 5, 8});
  const auto expected = layer.backward(dout, layer.forward(x, memory));
  TransformerDecoderLayerForward<double> kept = layer.forward(Tensor<double, 3>(x), Tensor<double, 3>(memory));
  const TransformerDecoderLayerForward<double> copy = kept;
  kept = TransformerDecoderLayerForward<double>();
  const auto g = layer.backward(dout, copy);
  EXPECT_EQ(max_abs_difference(g.d_input, expected.d_input), 0.0);
  EXPECT_EQ(max_abs_difference(g.d_memory, expected.d_memory), 0.0);
}

TEST(TransformerDecoderLayerTest, BadArgumentsThrowNamingThem) {
  TransformerDecoderLayerConfig cfg = small_decoder_config();
  cfg.memory_dim = -2;
  expect_error<std::invalid_argument>([&] { TransformerDecoderLayer<float> l(cfg); },
                                      {"TransformerDecoderLayer", "cfg.memory_dim"});
  cfg = small_decoder_config();
  cfg.ffn_dim = 0;
  expect_error<std::invalid_argument>([&] { TransformerDecoderLayer<float> l(cfg); }, {"cfg.ffn_dim"});

  TransformerDecoderLayer<float> layer(small_decoder_config());
  Tensor<float, 3> x({2, 3, 8}), memory({2, 4, 6}), narrow({2, 4, 5}), other_batch({1, 4, 6});
  const char* fn = "TransformerDecoderLayer::forward";
  expect_error<ShapeError>([&] { layer.forward(x, narrow); }, {fn, "memory", "(2, *, 6)", "(2, 4, 5)"});
  expect_error<ShapeError>([&] { layer.forward(x, other_batch); }, {fn, "memory", "(1, 4, 6)"});
  AttentionOptions<float> opts;
  opts.key_lengths = {4, 9};
  expect_error<std::invalid_argument>([&] { layer.forward(x, memory, {}, opts); }, {fn, "key_lengths"});
  opts = {};
  opts.dropout_p = 0.5f;
  expect_error<std::invalid_argument>([&] { layer.forward(x, memory, {}, opts); }, {fn, "dropout_p"});
  const auto f = layer.forward(x, memory);
  expect_error<ShapeError>([&] { layer.backward(memory, f); }, {"TransformerDecoderLayer::backward", "dout"});
  layer.params().norm3_weight = Tensor<float, 1>({3});
  expect_error<ShapeError>([&] { layer.forward(x, memory); }, {fn, "params().norm3_weight", "(8)", "(3)"});
}

TEST(TransformerDecoderLayerTest, FailedStepLeavesTheCacheAsItWas) {
  TransformerDecoderLayer<float> layer(small_decoder_config());
  Tensor<float, 3> x({2, 1, 8}), memory({2, 4, 6});
  KVCache<float> cache = layer.make_cache(2);
  const MemoryKeysValues<float> source = layer.project_memory(memory);
  layer.step(x, cache, source);
  const char* fn = "TransformerDecoderLayer::step";
  AttentionOptions<float> memory_opts;
  memory_opts.key_lengths = {4, 5};  // past the memory's 4 rows
  expect_error<std::invalid_argument>([&] { layer.step(x, cache, source, {}, memory_opts); }, {fn, "key_lengths"});
  MemoryKeysValues<float> wrong = source;
  wrong.values = Tensor<float, 4>({2, 2, 3, 4});
  expect_error<ShapeError>([&] { layer.step(x, cache, wrong); }, {fn, "memory.values", "(2, 2, 3, 4)"});
  Tensor<float, 3> other_batch({1, 4, 6});
  expect_error<ShapeError>([&] { layer.step(x, cache, layer.project_memory(other_batch)); },
                           {fn, "memory.keys", "(1, 2, 4, 4)"});
  EXPECT_EQ(cache.length(), 1) << "a failed step leaves the cache as it was";
  expect_error<ShapeError>([&] { layer.project_memory(x); },
                           {"TransformerDecoderLayer::project_memory", "memory", "(*, *, 6)"});
}

// ---- The stack ----------------------------------------------------------------------------------------

TransformerDecoderStackConfig small_stack_config() {
  TransformerDecoderStackConfig cfg;
  cfg.layer = small_decoder_config();
  cfg.layer.norm_first = true;
  cfg.num_layers = 2;
  cfg.final_norm = true;
  return cfg;
}

TEST(TransformerDecoderStackTest, EveryGradientMatchesFiniteDifferences) {
  TransformerDecoderStack<double> stack(small_stack_config(), 31);
  Random rng(32);
  TransformerDecoderStackParams<double>& p = stack.params();
  for (TransformerDecoderLayerParams<double>& layer : p.layers) randomize_layer(layer, rng);
  p.norm_weight = rng.uniform_tensor<double, 1>(p.norm_weight.shape(), 0.5, 1.5);
  p.norm_bias = rng.uniform_tensor<double, 1>(p.norm_bias.shape());
  Tensor<double, 3> x = rng.normal_tensor<double, 3>({2, 4, 8});
  Tensor<double, 3> memory = rng.normal_tensor<double, 3>({2, 3, 6});
  const Tensor<double, 3> weights = rng.normal_tensor<double, 3>({2, 4, 8});
  AttentionOptions<double> source;
  source.key_lengths = {3, 2};
  const auto loss = [&] { return weighted_sum(stack.forward(x, memory, {}, source).output, weights); };
  const auto g = stack.backward(weights, stack.forward(x, memory, {}, source));
  expect_gradient("x", x, g.d_input, loss);
  expect_gradient("memory (summed over the layers)", memory, g.d_memory, loss);
  for (std::size_t i = 0; i < p.layers.size(); ++i)
    for_each_decoder_layer_param(p.layers[i], g.params.layers[i],
                                 [&](const std::string& name, auto& param, const auto& grad) {
                                   expect_gradient("layers." + std::to_string(i) + "." + name, param, grad, loss);
                                 });
  expect_gradient("norm_weight", p.norm_weight, g.params.norm_weight, loss);
  expect_gradient("norm_bias", p.norm_bias, g.params.norm_bias, loss);
}

TEST(TransformerDecoderStackTest, StepThroughEveryLayerEqualsTheForward) {
  TransformerDecoderStack<double> stack(small_stack_config(), 33);
  Random rng(34);
  for (TransformerDecoderLayerParams<double>& layer : stack.params().layers) randomize_layer(layer, rng);
  const Tensor<double, 3> x = rng.normal_tensor<double, 3>({2, 6, 8});
  const Tensor<double, 3> memory = rng.normal_tensor<double, 3>({2, 5, 6});
  AttentionOptions<double> source;
  source.key_lengths = {2, 5};
  const Tensor<double, 3> full = stack.forward(x, memory, {}, source).output;
  TransformerStackCache<double> cache = stack.make_cache(2);
  const TransformerDecoderStackMemory<double> projected = stack.project_memory(memory);
  ASSERT_EQ(projected.layers.size(), 2u);
  Index done = 0;
  for (Index piece : {2, 1, 3}) {
    const TensorView<const double, 3> part(x.data() + done * 8, {2, piece, 8}, {48, 8, 1});
    const Tensor<double, 3> y = stack.step(part, cache, projected, {}, source);
    const TensorView<const double, 3> expected(full.data() + done * 8, {2, piece, 8}, {48, 8, 1});
    EXPECT_TRUE(all_close(y, expected, 1e-12)) << "rows " << done << " to " << done + piece - 1;
    done += piece;
  }
  EXPECT_EQ(cache.length(), 6);
}

TEST(TransformerDecoderStackTest, FailedStepLeavesEveryCacheAsItWas) {
  TransformerDecoderStack<float> stack(small_stack_config());
  Tensor<float, 3> x({1, 2, 8}), memory({1, 4, 6});
  TransformerStackCache<float> cache = stack.make_cache(1);
  TransformerDecoderStackMemory<float> projected = stack.project_memory(memory);
  stack.step(x, cache, projected);
  const char* fn = "TransformerDecoderStack::step";
  AttentionOptions<float> source;
  source.key_lengths = {7};
  expect_error<std::invalid_argument>([&] { stack.step(x, cache, projected, {}, source); }, {fn, "key_lengths"});
  projected.layers[1].keys = Tensor<float, 4>({1, 2, 4, 3});  // head dim 3, not 4
  expect_error<ShapeError>([&] { stack.step(x, cache, projected); }, {fn, "memory.keys", "(1, 2, 4, 3)"});
  projected.layers.pop_back();
  expect_error<std::invalid_argument>([&] { stack.step(x, cache, projected); }, {fn, "memory", "holds 1 layers"});
  for (const KVCache<float>& layer : cache.layers) EXPECT_EQ(layer.length(), 2) << "no layer stepped";
  TransformerDecoderStackConfig cfg = small_stack_config();
  cfg.num_layers = 0;
  expect_error<std::invalid_argument>([&] { TransformerDecoderStack<float> s(cfg); },
                                      {"TransformerDecoderStack", "cfg.num_layers"});
}

// ---- The module's memory entries ----------------------------------------------------------------------

TEST(MultiHeadAttentionMemoryTest, AttendMemoryIsTheForwardBitForBit) {
  MultiHeadAttentionConfig cfg;
  cfg.embed_dim = 12;
  cfg.num_heads = 6;
  cfg.num_kv_heads = 2;
  cfg.kdim = 5;
  cfg.vdim = 7;
  MultiHeadAttention<double> mha(cfg, 26);
  Random rng(27);
  for (auto* bias : {&mha.params().q_bias, &mha.params().k_bias, &mha.params().v_bias, &mha.params().out_bias})
    *bias = rng.normal_tensor<double, 1>(bias->shape());
  const Tensor<double, 3> query = rng.normal_tensor<double, 3>({3, 4, 12});
  const Tensor<double, 3> key = rng.normal_tensor<double, 3>({3, 6, 5});
  const Tensor<double, 3> value = rng.normal_tensor<double, 3>({3, 6, 7});
  AttentionOptions<double> opts;
  opts.key_lengths = {6, 1, 3};
  opts.window_left = 2;
  const MemoryKeysValues<double> memory = mha.project_memory(key, value);
  EXPECT_EQ(memory.keys.shape(), (std::array<Index, 4>{3, 2, 6, 2}));
  EXPECT_EQ(max_abs_difference(mha.attend_memory(query, memory, opts), mha.forward(query, key, value, opts).output),
            0.0);
}

TEST(MultiHeadAttentionMemoryTest, PositionsAndTrainingOptionsAreRefused) {
  MultiHeadAttentionConfig cfg;
  cfg.embed_dim = 8;
  cfg.num_heads = 2;
  Tensor<float, 3> x({1, 3, 8});
  cfg.rope_dim = 2;
  expect_error<std::invalid_argument>([&] { MultiHeadAttention<float>(cfg).project_memory(x, x); },
                                      {"MultiHeadAttention::project_memory", "cfg.rope_dim"});
  cfg.rope_dim = 0;
  cfg.alibi = true;
  expect_error<std::invalid_argument>([&] { MultiHeadAttention<float>(cfg).project_memory(x, x); }, {"cfg.alibi"});
  cfg.alibi = false;
  const MultiHeadAttention<float> mha(cfg);
  const MemoryKeysValues<float> memory = mha.project_memory(x, x);
  AttentionOptions<float> opts;
  opts.need_weights = true;
  expect_error<std::invalid_argument>([&] { mha.attend_memory(x, memory, opts); },
                                      {"MultiHeadAttention::attend_memory", "opts.need_weights"});
  opts = {};
  opts.dropout_p = 0.1f;
  expect_error<std::invalid_argument>([&] { mha.attend_memory(x, memory, opts); }, {"opts.dropout_p"});
}

}  // namespace
}  // namespace selfattn::test
