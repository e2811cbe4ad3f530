// Tests of the transformer layer and what it is made of: LayerNorm and RMSNorm, the activations, FeedForward,
// TransformerLayer (pre- and post-norm) and TransformerStack. Every gradient of every input and parameter is checked
// by central finite differences in double; incremental decoding through the layers equals the full forward; bad
// arguments throw naming the argument and leave caches unchanged. (Conformance with PyTorch's
// nn.TransformerEncoderLayer / nn.TransformerEncoder: transformer_pytorch_test.cpp.)
#include <selfattn/selfattn.hpp>

#include "support/compare.hpp"
#include "support/expect_error.hpp"
#include "support/gradcheck.hpp"
#include "support/layer_params.hpp"
#include "support/random.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

namespace selfattn::test {
namespace {

// ---- Norms --------------------------------------------------------------------------------------------

TEST(NormTest, LayerNormAndRmsNormMatchTheirFormulas) {
  Random rng(1);
  Tensor<double, 3> x = rng.normal_tensor<double, 3>({2, 3, 7}, 2.0);
  LayerNorm<double> layer(7, 1e-3);
  RMSNorm<double> rms(7, 1e-3);
  layer.params().weight = rng.normal_tensor<double, 1>({7});
  layer.params().bias = rng.normal_tensor<double, 1>({7});
  rms.params().weight = rng.normal_tensor<double, 1>({7});
  const Tensor<double, 3> y_layer = layer.forward(x).output, y_rms = rms.forward(x).output;
  Tensor<double, 3> expected_layer(x.shape()), expected_rms(x.shape());
  for (Index b = 0; b < 2; ++b)
    for (Index l = 0; l < 3; ++l) {
      double mean = 0, square = 0;
      for (Index e = 0; e < 7; ++e) mean += x(b, l, e) / 7;
      for (Index e = 0; e < 7; ++e) square += x(b, l, e) * x(b, l, e) / 7;
      double var = 0;
      for (Index e = 0; e < 7; ++e) var += (x(b, l, e) - mean) * (x(b, l, e) - mean) / 7;
      for (Index e = 0; e < 7; ++e) {
        expected_layer(b, l, e) = (x(b, l, e) - mean) / std::sqrt(var + 1e-3) * layer.params().weight(e) +
                                  layer.params().bias(e);
        expected_rms(b, l, e) = x(b, l, e) / std::sqrt(square + 1e-3) * rms.params().weight(e);
      }
    }
  EXPECT_TRUE(all_close(y_layer, expected_layer, 1e-14));
  EXPECT_TRUE(all_close(y_rms, expected_rms, 1e-14));
  EXPECT_EQ(rms.params().bias.size(), 0);
}

TEST(NormTest, GradientsMatchFiniteDifferences) {
  for (NormKind kind : {NormKind::layer_norm, NormKind::rms_norm})
    for (bool affine : {true, false}) {
      SCOPED_TRACE(std::string(kind == NormKind::layer_norm ? "LayerNorm" : "RMSNorm") + (affine ? " affine" : ""));
      Random rng(2);
      Tensor<double, 3> x = rng.normal_tensor<double, 3>({2, 3, 5});
      const Tensor<double, 3> weights = rng.normal_tensor<double, 3>({2, 3, 5});
      LayerNorm<double> layer(5, 1e-5, affine);
      RMSNorm<double> rms(5, 1e-5, affine);
      detail::Normalization<double>& norm = kind == NormKind::layer_norm ? static_cast<detail::Normalization<double>&>(layer)
                                                                         : static_cast<detail::Normalization<double>&>(rms);
      if (affine) norm.params().weight = rng.normal_tensor<double, 1>({5});
      if (affine && kind == NormKind::layer_norm) norm.params().bias = rng.normal_tensor<double, 1>({5});
      const auto loss = [&] { return weighted_sum(norm.forward(x).output, weights); };
      const NormGradients<double> g = norm.backward(weights, norm.forward(x));
      expect_gradient("x", x, g.d_input, loss);
      expect_gradient("weight", norm.params().weight, g.params.weight, loss);
      expect_gradient("bias", norm.params().bias, g.params.bias, loss);
    }
}

TEST(NormTest, BadArgumentsThrowNamingThem) {
  test::expect_error<std::invalid_argument>([] { LayerNorm<float> n(0); }, {"LayerNorm", "dim", "got 0"});
  test::expect_error<std::invalid_argument>([] { RMSNorm<float> n(4, -1.0); }, {"RMSNorm", "eps"});
  LayerNorm<float> norm(4);
  Tensor<float, 3> x({1, 2, 5});
  test::expect_error<ShapeError>([&] { norm.forward(x); }, {"LayerNorm::forward", "x", "(*, *, 4)", "(1, 2, 5)"});
  Tensor<float, 3> good({1, 2, 4});
  const NormForward<float> f = norm.forward(good);
  test::expect_error<ShapeError>([&] { norm.backward(x, f); }, {"LayerNorm::backward", "dout"});
  norm.params().weight = Tensor<float, 1>({3});
  test::expect_error<ShapeError>([&] { norm.forward(good); }, {"params().weight", "(4)", "(3)"});
}

// ---- Activations and the feed-forward network ---------------------------------------------------------

const Activation all_activations[] = {Activation::relu, Activation::gelu, Activation::gelu_tanh, Activation::swiglu};

TEST(ActivationTest, MatchTheirFormulas) {
  const std::vector<double> z = {-3.0, -0.7, -0.1, 0.2, 1.3, 4.0};
  for (Activation a : all_activations) {
    SCOPED_TRACE(activation_name(a));
    const Index width = detail::activation_input_width(a, 3);
    Tensor<double, 3> in({1, 2, width}), out({1, 2, 3});
    for (Index n = 0; n < in.size(); ++n) in.data()[n] = z[static_cast<std::size_t>(n) % z.size()] * (1 + 0.1 * n);
    detail::activation_forward<double>(a, in, out.view());
    for (Index l = 0; l < 2; ++l)
      for (Index c = 0; c < 3; ++c) {
        const double v = in(0, l, c);
        double expected = 0;
        switch (a) {
          case Activation::relu: expected = v > 0 ? v : 0; break;
          case Activation::gelu: expected = 0.5 * v * (1 + std::erf(v / std::sqrt(2.0))); break;
          case Activation::gelu_tanh:
            expected = 0.5 * v * (1 + std::tanh(std::sqrt(2 / 3.141592653589793) * (v + 0.044715 * v * v * v)));
            break;
          case Activation::swiglu: expected = v / (1 + std::exp(-v)) * in(0, l, c + 3); break;
        }
        EXPECT_NEAR(out(0, l, c), expected, 1e-15 * (1 + std::abs(expected))) << "row " << l << " column " << c;
      }
  }
}

TEST(ActivationTest, FloatAgreesWithDouble) {  // Eigen's vectorised float erf, tanh and exp
  Random rng(3);
  for (Activation a : all_activations) {
    SCOPED_TRACE(activation_name(a));
    const Index width = detail::activation_input_width(a, 37);
    const Tensor<double, 3> z = rng.normal_tensor<double, 3>({2, 5, width}, 3.0);
    const Tensor<double, 3> dh = rng.normal_tensor<double, 3>({2, 5, 37});
    Tensor<double, 3> h({2, 5, 37}), dz(z.shape());
    Tensor<float, 3> zf(z.shape()), dhf(dh.shape()), hf({2, 5, 37}), dzf(z.shape());
    for (Index n = 0; n < z.size(); ++n) zf.data()[n] = static_cast<float>(z.data()[n]);
    for (Index n = 0; n < dh.size(); ++n) dhf.data()[n] = static_cast<float>(dh.data()[n]);
    // the double computation on the float-rounded inputs: what float can at best reproduce
    Tensor<double, 3> zr(z.shape()), dhr(dh.shape());
    for (Index n = 0; n < z.size(); ++n) zr.data()[n] = zf.data()[n];
    for (Index n = 0; n < dh.size(); ++n) dhr.data()[n] = dhf.data()[n];
    detail::activation_forward<double>(a, zr, h.view());
    detail::activation_backward<double>(a, zr, dhr, dz.view());
    detail::activation_forward<float>(a, zf, hf.view());
    detail::activation_backward<float>(a, zf, dhf, dzf.view());
    EXPECT_TRUE(all_close(hf, h, 2e-6)) << "forward";
    EXPECT_TRUE(all_close(dzf, dz, 2e-6)) << "backward";
  }
}

TEST(FeedForwardTest, GradientsMatchFiniteDifferences) {
  for (Activation a : all_activations)
    for (bool training : {false, true}) {
      SCOPED_TRACE(std::string(activation_name(a)) + (training ? ", training with dropout 0.3" : ""));
      FeedForwardConfig cfg;
      cfg.embed_dim = 4;
      cfg.ffn_dim = 6;
      cfg.activation = a;
      cfg.dropout = 0.3;
      FeedForward<double> ffn(cfg, 5);
      ffn.set_training(training);
      Random rng(4);
      Tensor<double, 3> x = rng.normal_tensor<double, 3>({2, 3, 4});
      const Tensor<double, 3> weights = rng.normal_tensor<double, 3>({2, 3, 4});
      auto& p = ffn.params();
      const auto loss = [&] { return weighted_sum(ffn.forward(x, 77).output, weights); };
      const FeedForwardGradients<double> g = ffn.backward(weights, ffn.forward(x, 77));
      expect_gradient("x", x, g.d_input, loss);
      expect_gradient("linear1_weight", p.linear1_weight, g.params.linear1_weight, loss);
      expect_gradient("linear1_bias", p.linear1_bias, g.params.linear1_bias, loss);
      expect_gradient("linear2_weight", p.linear2_weight, g.params.linear2_weight, loss);
      expect_gradient("linear2_bias", p.linear2_bias, g.params.linear2_bias, loss);
    }
}

TEST(FeedForwardTest, DropoutIsKeyedBySeedAndOffOutsideTraining) {
  FeedForwardConfig cfg;
  cfg.embed_dim = 8;
  cfg.ffn_dim = 64;
  cfg.dropout = 0.5;
  cfg.activation = Activation::gelu;  // no exact zeros of its own
  FeedForward<float> ffn(cfg);
  Random rng(6);
  const Tensor<float, 3> x = rng.normal_tensor<float, 3>({2, 16, 8});
  const Tensor<float, 3> eval = ffn.forward(x, 1).output;
  EXPECT_EQ(test::max_abs_difference(eval, ffn.forward(x, 2).output), 0.0) << "no dropout outside training";
  ffn.set_training(true);
  const FeedForwardForward<float> a = ffn.forward(x, 1);
  EXPECT_EQ(test::max_abs_difference(a.output, ffn.forward(x, 1).output), 0.0) << "same seed, same mask";
  EXPECT_GT(test::max_abs_difference(a.output, ffn.forward(x, 2).output), 0.0) << "another seed, another mask";
  // half of the 2048 hidden units are dropped (binomial: standard deviation 0.011)
  Index zeros = 0;
  for (Index n = 0; n < a.saved->hidden.size(); ++n) zeros += a.saved->hidden.data()[n] == 0.0f ? 1 : 0;
  const double dropped = static_cast<double>(zeros) / static_cast<double>(a.saved->hidden.size());
  EXPECT_GT(dropped, 0.45);
  EXPECT_LT(dropped, 0.55);
}

TEST(FeedForwardTest, BadConfigurationsThrowNamingTheField) {
  FeedForwardConfig cfg;
  cfg.embed_dim = 4;
  cfg.ffn_dim = 0;
  test::expect_error<std::invalid_argument>([&] { FeedForward<float> f(cfg); }, {"FeedForward", "cfg.ffn_dim"});
  cfg.ffn_dim = 8;
  cfg.dropout = 1.0;
  test::expect_error<std::invalid_argument>([&] { FeedForward<float> f(cfg); }, {"cfg.dropout", "[0, 1)"});
  cfg.dropout = 0.0;
  cfg.activation = Activation::swiglu;
  FeedForward<float> swiglu(cfg);
  EXPECT_EQ(swiglu.params().linear1_weight.shape(), (std::array<Index, 2>{16, 4})) << "SwiGLU's linear1 is (2F, E)";
  EXPECT_EQ(swiglu.params().linear2_weight.shape(), (std::array<Index, 2>{4, 8}));
  swiglu.params().linear1_weight = Tensor<float, 2>({8, 4});
  Tensor<float, 3> x({1, 1, 4});
  test::expect_error<ShapeError>([&] { swiglu.forward(x); }, {"params().linear1_weight", "(16, 4)", "(8, 4)"});
}

// ---- The transformer layer ----------------------------------------------------------------------------

struct LayerCase {
  std::string name;
  TransformerLayerConfig cfg;
  AttentionOptions<double> opts;
  bool training = false;
};

TransformerLayerConfig small_layer_config() {
  TransformerLayerConfig cfg;
  cfg.attention.embed_dim = 8;
  cfg.attention.num_heads = 2;
  cfg.ffn_dim = 6;
  cfg.dropout = 0.0;
  return cfg;
}

std::vector<LayerCase> layer_cases() {
  std::vector<LayerCase> cases;
  {
    LayerCase c{"post-norm relu, key padding", small_layer_config(), {}, false};
    c.opts.key_lengths = {4, 2};
    cases.push_back(c);
  }
  {
    LayerCase c{"pre-norm gelu, causal", small_layer_config(), {}, false};
    c.cfg.norm_first = true;
    c.cfg.activation = Activation::gelu;
    c.opts.causal = Causal::top_left;
    cases.push_back(c);
  }
  {
    LayerCase c{"pre-norm RMSNorm SwiGLU, GQA, RoPE, decoder-only, no biases", small_layer_config(), {}, false};
    c.cfg.norm_first = true;
    c.cfg.norm = NormKind::rms_norm;
    c.cfg.activation = Activation::swiglu;
    c.cfg.attention.num_heads = 4;
    c.cfg.attention.num_kv_heads = 2;
    c.cfg.attention.rope_dim = 2;
    c.cfg.attention.bias = false;
    c.cfg.bias = false;
    c.cfg.causal = true;
    cases.push_back(c);
  }
  {
    LayerCase c{"post-norm gelu_tanh, ALiBi, sliding window, eps 1e-3", small_layer_config(), {}, false};
    c.cfg.activation = Activation::gelu_tanh;
    c.cfg.attention.alibi = true;
    c.cfg.norm_eps = 1e-3;
    c.opts.window_left = 1;
    c.opts.window_right = 1;
    cases.push_back(c);
  }
  for (bool norm_first : {false, true}) {
    LayerCase c{std::string(norm_first ? "pre" : "post") + "-norm in training: dropout everywhere", small_layer_config(),
                {}, true};
    c.cfg.norm_first = norm_first;
    c.cfg.dropout = 0.25;
    c.cfg.attention.dropout = 0.2;
    c.opts.seed = 1234;
    cases.push_back(c);
  }
  return cases;
}

TEST(TransformerLayerTest, EveryGradientMatchesFiniteDifferences) {
  for (const LayerCase& c : layer_cases()) {
    SCOPED_TRACE(c.name);
    TransformerLayer<double> layer(c.cfg, 11);
    layer.set_training(c.training);
    Random rng(12);
    test::randomize_layer(layer.params(), rng);
    Tensor<double, 3> x = rng.normal_tensor<double, 3>({2, 4, 8});
    const Tensor<double, 3> weights = rng.normal_tensor<double, 3>({2, 4, 8});
    const auto loss = [&] { return weighted_sum(layer.forward(x, c.opts).output, weights); };
    TransformerLayerGradients<double> g = layer.backward(weights, layer.forward(x, c.opts));
    expect_gradient("x", x, g.d_input, loss);
    test::for_each_layer_param(layer.params(), g.params, [&](const std::string& name, auto& param, const auto& grad) {
      expect_gradient(name, param, grad, loss);
    });
  }
}

TEST(TransformerLayerTest, FloatAgreesWithDouble) {
  for (const LayerCase& c : layer_cases()) {
    SCOPED_TRACE(c.name);
    TransformerLayer<double> layer(c.cfg, 13);
    TransformerLayer<float> layer_f(c.cfg, 13);
    layer.set_training(c.training);
    layer_f.set_training(c.training);
    Random rng(14);
    const Tensor<double, 3> x = rng.normal_tensor<double, 3>({2, 4, 8});
    const Tensor<double, 3> dout = rng.normal_tensor<double, 3>({2, 4, 8});
    Tensor<float, 3> xf(x.shape()), doutf(x.shape());
    for (Index n = 0; n < x.size(); ++n) xf.data()[n] = static_cast<float>(x.data()[n]);
    for (Index n = 0; n < x.size(); ++n) doutf.data()[n] = static_cast<float>(dout.data()[n]);
    AttentionOptions<float> opts_f;
    opts_f.causal = c.opts.causal;
    opts_f.key_lengths = c.opts.key_lengths;
    opts_f.window_left = c.opts.window_left;
    opts_f.window_right = c.opts.window_right;
    opts_f.seed = c.opts.seed;
    const auto f = layer.forward(x, c.opts);
    const auto ff = layer_f.forward(xf, opts_f);
    EXPECT_TRUE(all_close(ff.output, f.output, 1e-5));
    EXPECT_TRUE(all_close(layer_f.backward(doutf, ff).d_input, layer.backward(dout, f).d_input, 1e-5));
  }
}

TEST(TransformerLayerTest, StepInPiecesEqualsTheCausalForward) {
  for (LayerCase c : layer_cases()) {
    if (c.training) continue;  // step applies no dropout
    SCOPED_TRACE(c.name);
    c.cfg.causal = true;
    TransformerLayer<double> layer(c.cfg, 15);
    Random rng(16);
    test::randomize_layer(layer.params(), rng);
    const Tensor<double, 3> x = rng.normal_tensor<double, 3>({2, 7, 8});
    const Tensor<double, 3> full = layer.forward(x).output;
    KVCache<double> cache = layer.make_cache(2);
    Index done = 0;
    for (Index piece : {3, 1, 1, 2}) {
      const TensorView<const double, 3> part(x.data() + done * 8, {2, piece, 8}, {56, 8, 1});
      const Tensor<double, 3> y = layer.step(part, cache);
      const TensorView<const double, 3> expected(full.data() + done * 8, {2, piece, 8}, {56, 8, 1});
      EXPECT_TRUE(all_close(y, expected, 1e-12)) << "rows " << done << " to " << done + piece - 1;
      done += piece;
    }
    EXPECT_EQ(cache.length(), 7);
  }
}

TEST(TransformerLayerTest, WeightsAreReturnedWhenAsked) {
  TransformerLayerConfig cfg = small_layer_config();
  TransformerLayer<float> layer(cfg);
  Tensor<float, 3> x({1, 3, 8});
  AttentionOptions<float> opts;
  opts.need_weights = true;
  opts.causal = Causal::top_left;
  const TransformerLayerForward<float> f = layer.forward(x, opts);
  ASSERT_EQ(f.weights.shape(), (std::array<Index, 4>{1, 2, 3, 3}));
  EXPECT_EQ(f.weights(0, 1, 0, 2), 0.0f) << "causal: row 0 sees key 0 only";
  EXPECT_EQ(layer.forward(x).weights.size(), 0);
}

TEST(TransformerLayerTest, ForwardKeepsTemporaryInputForBackward) {
  TransformerLayer<double> layer(small_layer_config());
  Random rng(17);
  const Tensor<double, 3> x = rng.normal_tensor<double, 3>({1, 5, 8});
  const Tensor<double, 3> dout = rng.normal_tensor<double, 3>({1, 5, 8});
  const Tensor<double, 3> expected = layer.backward(dout, layer.forward(x)).d_input;
  TransformerLayerForward<double> kept = layer.forward(Tensor<double, 3>(x));  // the temporary is moved in
  const TransformerLayerForward<double> copy = kept;
  kept = TransformerLayerForward<double>();
  EXPECT_EQ(test::max_abs_difference(layer.backward(dout, copy).d_input, expected), 0.0);
}

TEST(TransformerLayerTest, BadArgumentsThrowNamingThem) {
  TransformerLayerConfig cfg = small_layer_config();
  cfg.ffn_dim = -1;
  test::expect_error<std::invalid_argument>([&] { TransformerLayer<float> l(cfg); }, {"TransformerLayer", "cfg.ffn_dim"});
  cfg = small_layer_config();
  cfg.norm_eps = std::nan("");
  test::expect_error<std::invalid_argument>([&] { TransformerLayer<float> l(cfg); }, {"cfg.norm_eps"});
  cfg = small_layer_config();
  cfg.attention.num_heads = 3;
  test::expect_error<std::invalid_argument>([&] { TransformerLayer<float> l(cfg); }, {"cfg.num_heads"});

  TransformerLayer<float> layer(small_layer_config());
  Tensor<float, 3> wrong({1, 3, 7}), x({1, 3, 8});
  test::expect_error<ShapeError>([&] { layer.forward(wrong); }, {"TransformerLayer::forward", "x", "(*, *, 8)", "(1, 3, 7)"});
  const auto f = layer.forward(x);
  test::expect_error<ShapeError>([&] { layer.backward(wrong, f); }, {"TransformerLayer::backward", "dout"});
  test::expect_error<std::invalid_argument>([&] { layer.backward(x, TransformerLayerForward<float>()); }, {"fwd"});
  AttentionOptions<float> opts;
  opts.key_lengths = {9};
  test::expect_error<std::invalid_argument>([&] { layer.forward(x, opts); }, {"key_lengths"});
  KVCache<float> cache = layer.make_cache(1);
  test::expect_error<std::invalid_argument>([&] { layer.step(x, cache, opts); }, {"key_lengths"});
  EXPECT_EQ(cache.length(), 0) << "a failed step leaves the cache as it was";
  layer.params().norm2_bias = Tensor<float, 1>({3});
  test::expect_error<ShapeError>([&] { layer.forward(x); }, {"params().norm2_bias", "(8)", "(3)"});
}

// The layer's attention runs at cfg.attention.dropout (training mode only) and its step as MultiHeadAttention::step:
// options the layer would ignore throw naming the layer, before anything runs; the values it uses pass.
TEST(TransformerLayerTest, OptionsTheLayerWouldIgnoreThrow) {
  TransformerLayerConfig cfg = small_layer_config();
  cfg.attention.dropout = 0.2;
  cfg.dropout = 0.1;
  TransformerLayer<float> layer(cfg);
  const Tensor<float, 3> x = Random(26).normal_tensor<float, 3>({1, 3, 8});
  AttentionOptions<float> opts;
  opts.dropout_p = 0.1f;  // the residual and FFN rate, not the attention's
  test::expect_error<std::invalid_argument>(
      [&] { layer.forward(x, opts); },
      {"[TransformerLayer::forward]", "opts.dropout_p", "cfg.attention.dropout = 0.200000", "got 0.100000"});
  opts.dropout_p = 0.2f;
  EXPECT_TRUE(all_close(layer.forward(x, opts).output, layer.forward(x).output, 0.0));
  KVCache<float> cache = layer.make_cache(1);
  AttentionOptions<float> weights, top_left;
  weights.need_weights = true;
  top_left.causal = Causal::top_left;
  test::expect_error<std::invalid_argument>([&] { layer.step(x, cache, weights); },
                                            {"[TransformerLayer::step]", "opts.need_weights"});
  test::expect_error<std::invalid_argument>([&] { layer.step(x, cache, top_left); },
                                            {"[TransformerLayer::step]", "opts.causal", "Causal::top_left"});
  EXPECT_EQ(cache.length(), 0) << "a refused step leaves the cache as it was";
}

// ---- The stack ----------------------------------------------------------------------------------------

TransformerStackConfig small_stack_config(Index layers) {
  TransformerStackConfig cfg;
  cfg.layer = small_layer_config();
  cfg.layer.norm_first = true;
  cfg.layer.causal = true;
  cfg.layer.attention.rope_dim = 4;
  cfg.num_layers = layers;
  cfg.final_norm = true;
  return cfg;
}

TEST(TransformerStackTest, EveryGradientMatchesFiniteDifferences) {
  for (bool training : {false, true}) {
    SCOPED_TRACE(training ? "training with dropout" : "inference");
    TransformerStackConfig cfg = small_stack_config(2);
    cfg.layer.dropout = 0.2;
    TransformerStack<double> stack(cfg, 21);
    stack.set_training(training);
    Random rng(22);
    for (TransformerLayerParams<double>& p : stack.params().layers) test::randomize_layer(p, rng);
    for (Index n = 0; n < 8; ++n) stack.params().norm_weight.data()[n] = rng.uniform(0.5, 1.5);
    for (Index n = 0; n < 8; ++n) stack.params().norm_bias.data()[n] = rng.uniform(-0.5, 0.5);
    Tensor<double, 3> x = rng.normal_tensor<double, 3>({2, 3, 8});
    const Tensor<double, 3> weights = rng.normal_tensor<double, 3>({2, 3, 8});
    AttentionOptions<double> opts;
    opts.key_lengths = {3, 2};
    opts.seed = 99;
    const auto loss = [&] { return weighted_sum(stack.forward(x, opts).output, weights); };
    TransformerStackGradients<double> g = stack.backward(weights, stack.forward(x, opts));
    expect_gradient("x", x, g.d_input, loss);
    test::for_each_stack_param(stack.params(), g.params, [&](const std::string& name, auto& param, const auto& grad) {
      expect_gradient(name, param, grad, loss);
    });
  }
}

TEST(TransformerStackTest, StepThroughFourLayersEqualsTheForward) {
  for (bool norm_first : {true, false}) {
    SCOPED_TRACE(norm_first ? "pre-norm" : "post-norm");
    TransformerStackConfig cfg = small_stack_config(4);
    cfg.layer.norm_first = norm_first;
    cfg.final_norm = norm_first;
    cfg.layer.attention.num_heads = 4;
    cfg.layer.attention.num_kv_heads = 2;
    cfg.layer.attention.rope_dim = 2;
    TransformerStack<double> stack(cfg, 23);
    Random rng(24);
    for (TransformerLayerParams<double>& p : stack.params().layers) test::randomize_layer(p, rng);
    const Tensor<double, 3> x = rng.normal_tensor<double, 3>({2, 9, 8});
    const Tensor<double, 3> full = stack.forward(x).output;
    TransformerStackCache<double> cache = stack.make_cache(2);
    Index done = 0;
    for (Index piece : {4, 1, 1, 1, 2}) {
      const TensorView<const double, 3> part(x.data() + done * 8, {2, piece, 8}, {72, 8, 1});
      const Tensor<double, 3> y = stack.step(part, cache);
      const TensorView<const double, 3> expected(full.data() + done * 8, {2, piece, 8}, {72, 8, 1});
      EXPECT_TRUE(all_close(y, expected, 1e-12)) << "rows " << done << " to " << done + piece - 1;
      done += piece;
    }
    EXPECT_EQ(cache.length(), 9);
    for (const KVCache<double>& c : cache.layers) EXPECT_EQ(c.length(), 9);
  }
}

TEST(TransformerStackTest, FailedStepLeavesEveryCacheAsItWas) {
  TransformerStack<float> stack(small_stack_config(3));
  TransformerStackCache<float> cache = stack.make_cache(1);
  Random rng(25);
  const Tensor<float, 3> x = rng.normal_tensor<float, 3>({1, 2, 8});
  stack.step(x, cache);
  AttentionOptions<float> opts;
  opts.key_lengths = {1, 1};  // two entries for one sequence
  test::expect_error<ShapeError>([&] { stack.step(x, cache, opts); }, {"key_lengths"});
  for (const KVCache<float>& c : cache.layers) EXPECT_EQ(c.length(), 2);
  Tensor<float, 3> wide({1, 2, 9});
  test::expect_error<ShapeError>([&] { stack.step(wide, cache); }, {"TransformerStack::step", "x_new"});
  TransformerStackCache<float> short_cache = TransformerStack<float>(small_stack_config(2)).make_cache(1);
  test::expect_error<std::invalid_argument>([&] { stack.step(x, short_cache); }, {"cache", "holds 2 layers", "has 3"});
  cache.layers[1].clear();
  test::expect_error<std::invalid_argument>([&] { stack.step(x, cache); }, {"cache.layers[1]", "differs"});
  for (std::size_t i : {0u, 2u}) EXPECT_EQ(cache.layers[i].length(), 2);
}

TEST(TransformerStackTest, BadArgumentsThrowNamingThem) {
  TransformerStackConfig cfg = small_stack_config(0);
  test::expect_error<std::invalid_argument>([&] { TransformerStack<float> s(cfg); }, {"cfg.num_layers", "got 0"});
  TransformerStack<float> stack(small_stack_config(2));
  Tensor<float, 3> x({1, 2, 8});
  const auto f = stack.forward(x);
  TransformerStack<float> other(small_stack_config(3));
  test::expect_error<std::invalid_argument>([&] { other.backward(x, f); }, {"TransformerStack::backward", "fwd"});
  stack.params().layers.pop_back();
  test::expect_error<std::invalid_argument>([&] { stack.forward(x); }, {"params().layers", "expected 2", "got 1"});
}

// As the layer: options the stack would ignore throw naming the stack, before any layer runs or any cache grows.
TEST(TransformerStackTest, OptionsTheStackWouldIgnoreThrow) {
  TransformerStackConfig cfg = small_stack_config(2);
  cfg.layer.attention.dropout = 0.3;
  TransformerStack<float> stack(cfg);
  stack.set_training(true);
  const Tensor<float, 3> x = Random(27).normal_tensor<float, 3>({1, 2, 8});
  AttentionOptions<float> opts;
  opts.dropout_p = 0.5f;
  test::expect_error<std::invalid_argument>(
      [&] { stack.forward(x, opts); },
      {"[TransformerStack::forward]", "opts.dropout_p", "cfg.layer.attention.dropout = 0.300000", "this call: 0.300000",
       "got 0.500000"});
  TransformerStackCache<float> cache = stack.make_cache(1);
  stack.step(x, cache);
  AttentionOptions<float> dropout;
  dropout.dropout_p = 0.3f;  // the forward's rate, but step applies none
  test::expect_error<std::invalid_argument>([&] { stack.step(x, cache, dropout); },
                                            {"[TransformerStack::step]", "opts.dropout_p", "expected 0, got 0.300000"});
  for (const KVCache<float>& c : cache.layers) EXPECT_EQ(c.length(), 2);
}

// Every module a stack builds gets its own seed: no two layers of one stack share any weight matrix (attention or
// FFN). The same seed rebuilds the stack bit for bit, the default seed is 0, and another seed gives other weights.
TEST(TransformerStackTest, LayersAreDifferentAndSeedsReproduce) {
  const TransformerStackConfig cfg = small_stack_config(3);
  TransformerStack<float> a(cfg, 7), b(cfg, 7), c(cfg, 8), unseeded(cfg), zero(cfg, 0);
  test::for_each_stack_param(a.params(), b.params(), [](const std::string& name, const auto& p, const auto& q) {
    EXPECT_EQ(test::max_abs_difference(p, q), 0.0) << name << ": the same seed, the same stack";
  });
  test::for_each_stack_param(unseeded.params(), zero.params(), [](const std::string& name, const auto& p,
                                                                   const auto& q) {
    EXPECT_EQ(test::max_abs_difference(p, q), 0.0) << name << ": the default seed is 0";
  });
  const std::vector<TransformerLayerParams<float>>& layers = a.params().layers;
  for (std::size_t i = 0; i < layers.size(); ++i)
    for (std::size_t j = i + 1; j < layers.size(); ++j)
      test::for_each_layer_param(layers[i], layers[j], [&](const std::string& name, const auto& p, const auto& q) {
        if (p.shape().size() == 2) {  // the weight matrices; norms start at 1 and biases at 0 in every layer
          EXPECT_GT(test::max_abs_difference(p, q), 0.0) << name << " of layers " << i << " and " << j;
        }
      });
  EXPECT_GT(test::max_abs_difference(layers[0].self_attn.q_weight, c.params().layers[0].self_attn.q_weight), 0.0);
  EXPECT_GT(test::max_abs_difference(layers[0].linear1_weight, c.params().layers[0].linear1_weight), 0.0);
}

// ---- State dicts ----------------------------------------------------------------------------------------

TEST(TransformerStateDictTest, RoundTripAndStrictLoading) {
  TransformerStack<double> stack(small_stack_config(2), 31);
  Random rng(32);
  for (TransformerLayerParams<double>& p : stack.params().layers) test::randomize_layer(p, rng);
  StateDict<double> sd = transformer_stack_state_dict(stack.params(), stack.config());
  EXPECT_EQ(sd.count("layers.1.self_attn.in_proj_weight"), 1u);
  EXPECT_EQ(sd.count("layers.0.norm2.bias"), 1u);
  EXPECT_EQ(sd.count("norm.weight"), 1u);
  TransformerStack<double> loaded(small_stack_config(2), 33);
  load_state_dict(loaded, sd);
  TransformerStackParams<double> original = stack.params();
  test::for_each_stack_param(loaded.params(), original, [](const std::string& name, auto& p, auto& q) {
    EXPECT_EQ(test::max_abs_difference(p, q), 0.0) << name;
  });

  StateDict<double> extra = sd;
  extra["layers.2.linear1.weight"] = extra["layers.1.linear1.weight"];
  test::expect_error<std::invalid_argument>([&] { load_state_dict(loaded, extra); }, {"layers.2.linear1.weight", "unexpected"});
  StateDict<double> missing = sd;
  missing.erase("layers.0.linear2.bias");
  test::expect_error<std::invalid_argument>([&] { load_state_dict(loaded, missing); }, {"layers.0.linear2.bias", "missing"});
  StateDict<double> wrong = sd;
  wrong["layers.1.norm1.weight"].shape = {4, 2};
  test::expect_error<ShapeError>([&] { load_state_dict(loaded, wrong); }, {"layers.1.norm1.weight", "(8,)", "(4, 2)"});

  TransformerLayerConfig rms = small_layer_config();
  rms.norm = NormKind::rms_norm;
  TransformerLayer<double> layer(rms);
  StateDict<double> layer_sd = transformer_layer_state_dict(layer.params(), layer.config(), "encoder.");
  EXPECT_EQ(layer_sd.count("encoder.norm1.bias"), 0u) << "RMSNorm has no bias";
  layer_sd["encoder.norm1.bias"] = layer_sd["encoder.norm1.weight"];
  test::expect_error<std::invalid_argument>([&] { load_state_dict(layer, layer_sd, "encoder."); },
                                            {"encoder.norm1.bias", "no such parameter"});
}

}  // namespace
}  // namespace selfattn::test
