// Tests of MultiHeadAttention::backward and linear_backward: PyTorch autograd conformance and central
// finite differences in double for every input and every parameter, across module configurations.
#include <selfattn/selfattn.hpp>

#include "support/compare.hpp"
#include "support/expect_error.hpp"
#include "support/gradcheck.hpp"
#include "support/module_config.hpp"
#include "support/pytorch_case.hpp"
#include "support/random.hpp"

#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

namespace selfattn::test {
namespace {

// ---- PyTorch autograd conformance ----------------------------------------------------------------

class PyTorchGradientConformance : public ::testing::TestWithParam<std::string> {};

// On every kernel: the default (fused backward after the automatic forward), the reference pair, and the decode
// forward with the fused backward (what a caller gets from the automatic choice for few query rows).
TEST_P(PyTorchGradientConformance, InputAndParameterGradientsMatchAutograd) {
  test::PyTorchCase c(GetParam());
  const test::Fixture& fx = c.fx;
  for (Kernel kernel : {Kernel::automatic, Kernel::reference, Kernel::decode}) {
    SCOPED_TRACE("kernel " + std::to_string(static_cast<int>(kernel)));
    AttentionOptions<double> opts = c.opts;
    opts.kernel = kernel;
    // PyTorch differentiated query, key and value as three leaves even in self-attention; so do we.
    const auto fwd = c.mha.forward(c.query, c.key, c.value, opts);
    const auto g = c.mha.backward(fx.tensor<3>("dout"), fwd);
    EXPECT_TRUE(all_close(g.d_query, fx.tensor<3>("d_query"), 1e-10));
    EXPECT_TRUE(all_close(g.d_key, fx.tensor<3>("d_key"), 1e-10));
    EXPECT_TRUE(all_close(g.d_value, fx.tensor<3>("d_value"), 1e-10));
    EXPECT_TRUE(all_close(g.params.q_weight, fx.tensor<2>("d_q_weight"), 1e-10));
    EXPECT_TRUE(all_close(g.params.k_weight, fx.tensor<2>("d_k_weight"), 1e-10));
    EXPECT_TRUE(all_close(g.params.v_weight, fx.tensor<2>("d_v_weight"), 1e-10));
    EXPECT_TRUE(all_close(g.params.out_weight, fx.tensor<2>("d_out_weight"), 1e-10));
    if (c.mha.config().bias) {
      EXPECT_TRUE(all_close(g.params.q_bias, fx.tensor<1>("d_q_bias"), 1e-10));
      EXPECT_TRUE(all_close(g.params.k_bias, fx.tensor<1>("d_k_bias"), 1e-10));
      EXPECT_TRUE(all_close(g.params.v_bias, fx.tensor<1>("d_v_bias"), 1e-10));
      EXPECT_TRUE(all_close(g.params.out_bias, fx.tensor<1>("d_out_bias"), 1e-10));
    } else {
      EXPECT_EQ(g.params.q_bias.size(), 0);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, PyTorchGradientConformance,
                         ::testing::Values("self_basic", "key_padding", "attn_mask_bool", "attn_mask_float",
                                           "attn_mask_float3d", "cross_kdim_vdim", "no_bias", "combined", "causal"));

// ---- finite differences ----------------------------------------------------------------------------

struct ModuleCase {
  std::string name;
  Index E, H, Hkv, kdim, vdim, rope_dim;
  RopeStyle style;
  bool alibi, bias, self_attention;
  double dropout;
  Index Lq, Lk;
  Causal causal;
};

const std::vector<ModuleCase> module_cases = {
    {"self", 8, 2, 0, 0, 0, 0, RopeStyle::half, false, true, true, 0.0, 5, 5, Causal::none},
    {"self causal, no bias", 6, 3, 0, 0, 0, 0, RopeStyle::half, false, false, true, 0.0, 4, 4, Causal::top_left},
    {"cross kdim vdim", 6, 3, 0, 5, 7, 0, RopeStyle::half, false, true, false, 0.0, 3, 5, Causal::none},
    {"gqa rope half", 8, 4, 2, 0, 0, 2, RopeStyle::half, false, true, true, 0.0, 5, 5, Causal::top_left},
    {"mqa rope interleaved cross", 8, 2, 1, 0, 0, 4, RopeStyle::interleaved, false, true, false, 0.0, 3, 6,
     Causal::bottom_right},
    {"alibi", 6, 3, 0, 0, 0, 0, RopeStyle::half, true, true, true, 0.0, 5, 5, Causal::none},
    {"dropout", 8, 2, 0, 0, 0, 0, RopeStyle::half, false, true, true, 0.3, 4, 4, Causal::none},
};

TEST(MultiHeadBackwardTest, EveryGradientMatchesFiniteDifferences) {
  Random random(41);
  for (const ModuleCase& c : module_cases) {
    SCOPED_TRACE(c.name);
    MultiHeadAttention<double> mha(ModuleConfig(c.E, c.H)
                                       .kv_heads(c.Hkv)
                                       .input_dims(c.kdim, c.vdim)
                                       .rope(c.rope_dim, c.style)
                                       .with_alibi(c.alibi)
                                       .with_bias(c.bias)
                                       .with_dropout(c.dropout),
                                   5);
    mha.set_training(c.dropout > 0);
    randomize_biases(mha, random);
    auto& p = mha.params();
    auto query = random.normal_tensor<double, 3>({2, c.Lq, c.E});
    auto key = random.normal_tensor<double, 3>({2, c.Lk, mha.config().kdim});
    auto value = random.normal_tensor<double, 3>({2, c.Lk, mha.config().vdim});
    const auto upstream = random.normal_tensor<double, 3>({2, c.Lq, c.E});
    AttentionOptions<double> opts;
    opts.causal = c.causal;
    opts.key_lengths = {c.Lk, c.Lk - 1};
    opts.seed = 8;

    if (c.self_attention) {
      // One input x feeds query, key and value (the fused projection): dx = d_query + d_key + d_value.
      const auto loss = [&] { return weighted_sum(mha.forward(query, opts).output, upstream); };
      const auto g = mha.backward(upstream, mha.forward(query, opts));
      Tensor<double, 3> dx = g.d_query;
      for (Index n = 0; n < dx.size(); ++n) dx.data()[n] += g.d_key.data()[n] + g.d_value.data()[n];
      EXPECT_TRUE(all_close(dx, numerical_gradient(query, loss), gradient_tolerance)) << "dx";
    } else {
      const auto loss = [&] { return weighted_sum(mha.forward(query, key, value, opts).output, upstream); };
      const auto g = mha.backward(upstream, mha.forward(query, key, value, opts));
      EXPECT_TRUE(all_close(g.d_query, numerical_gradient(query, loss), gradient_tolerance)) << "d_query";
      EXPECT_TRUE(all_close(g.d_key, numerical_gradient(key, loss), gradient_tolerance)) << "d_key";
      EXPECT_TRUE(all_close(g.d_value, numerical_gradient(value, loss), gradient_tolerance)) << "d_value";
    }
    const auto loss = [&] {
      return weighted_sum(
          (c.self_attention ? mha.forward(query, opts) : mha.forward(query, key, value, opts)).output, upstream);
    };
    const auto g = mha.backward(upstream, c.self_attention ? mha.forward(query, opts) : mha.forward(query, key, value, opts));
    EXPECT_TRUE(all_close(g.params.q_weight, numerical_gradient(p.q_weight, loss), gradient_tolerance)) << "q_weight";
    EXPECT_TRUE(all_close(g.params.k_weight, numerical_gradient(p.k_weight, loss), gradient_tolerance)) << "k_weight";
    EXPECT_TRUE(all_close(g.params.v_weight, numerical_gradient(p.v_weight, loss), gradient_tolerance)) << "v_weight";
    EXPECT_TRUE(all_close(g.params.out_weight, numerical_gradient(p.out_weight, loss), gradient_tolerance))
        << "out_weight";
    if (c.bias) {
      EXPECT_TRUE(all_close(g.params.q_bias, numerical_gradient(p.q_bias, loss), gradient_tolerance)) << "q_bias";
      EXPECT_TRUE(all_close(g.params.k_bias, numerical_gradient(p.k_bias, loss), gradient_tolerance)) << "k_bias";
      EXPECT_TRUE(all_close(g.params.v_bias, numerical_gradient(p.v_bias, loss), gradient_tolerance)) << "v_bias";
      EXPECT_TRUE(all_close(g.params.out_bias, numerical_gradient(p.out_bias, loss), gradient_tolerance)) << "out_bias";
    } else {
      EXPECT_EQ(g.params.q_bias.size(), 0);
    }
  }
}

TEST(MultiHeadBackwardTest, RepeatedBackwardIsBitwiseEqual) {
  Random random(42);
  MultiHeadAttention<float> mha(ModuleConfig(16, 4).rope(4).with_dropout(0.2), 1);
  mha.set_training(true);
  const auto x = random.normal_tensor<float, 3>({2, 7, 16});
  const auto dout = random.normal_tensor<float, 3>({2, 7, 16});
  const auto fwd = mha.forward(x);
  const auto a = mha.backward(dout, fwd), b = mha.backward(dout, fwd);
  EXPECT_TRUE(all_close(a.d_query, b.d_query, 0.0));
  EXPECT_TRUE(all_close(a.params.q_weight, b.params.q_weight, 0.0));
  EXPECT_TRUE(all_close(a.params.out_bias, b.params.out_bias, 0.0));
}

// The result of forward views its inputs for backward; a temporary input is moved into the result (a const one
// copied), so backward after the temporary's statement reads the kept tensor, not freed memory: the sanitize stage
// runs this under AddressSanitizer. Gradients equal those of named inputs bit for bit, also through a copy of the
// result that outlives the original.
TEST(MultiHeadBackwardTest, ForwardKeepsTemporaryInputsForBackward) {
  Random random(7);
  MultiHeadAttentionConfig cfg = ModuleConfig(16, 4).kv_heads(2).rope(4);
  const MultiHeadAttention<double> mha(cfg, 3);
  MultiHeadAttentionConfig cross_cfg = cfg;
  cross_cfg.kdim = 12;
  cross_cfg.vdim = 10;
  const MultiHeadAttention<double> cross(cross_cfg, 4);
  const auto x = random.normal_tensor<double, 3>({2, 5, 16});
  const auto memory_k = random.normal_tensor<double, 3>({2, 6, 12});
  const auto memory_v = random.normal_tensor<double, 3>({2, 6, 10});
  const auto dout = random.normal_tensor<double, 3>({2, 5, 16});
  const auto temporary = [](const Tensor<double, 3>& t) { return Tensor<double, 3>(t); };
  const auto const_temporary = [](const Tensor<double, 3>& t) -> const Tensor<double, 3> { return Tensor<double, 3>(t); };
  const auto expect_equal = [](const MhaGradients<double>& a, const MhaGradients<double>& b) {
    EXPECT_TRUE(all_close(a.d_query, b.d_query, 0.0));
    EXPECT_TRUE(all_close(a.d_key, b.d_key, 0.0));
    EXPECT_TRUE(all_close(a.d_value, b.d_value, 0.0));
    EXPECT_TRUE(all_close(a.params.q_weight, b.params.q_weight, 0.0));
    EXPECT_TRUE(all_close(a.params.k_weight, b.params.k_weight, 0.0));
    EXPECT_TRUE(all_close(a.params.v_weight, b.params.v_weight, 0.0));
  };

  const MhaForward<double> self_named = mha.forward(x);
  EXPECT_EQ(self_named.kept[0], nullptr);  // named inputs stay the caller's
  const MhaGradients<double> self_expected = mha.backward(dout, self_named);
  const MhaForward<double> self_kept = mha.forward(temporary(x));
  ASSERT_NE(self_kept.kept[0], nullptr);
  EXPECT_EQ(self_kept.query.data(), self_kept.kept[0]->data());  // moved, not copied: the view is of the kept data
  expect_equal(mha.backward(dout, self_kept), self_expected);

  std::optional<MhaForward<double>> original(mha.forward(temporary(x)));
  const MhaForward<double> copy = *original;
  original.reset();
  expect_equal(mha.backward(dout, copy), self_expected);

  const MhaGradients<double> cross_expected = cross.backward(dout, cross.forward(x, memory_k, memory_v));
  const MhaForward<double> cross_kept = cross.forward(temporary(x), const_temporary(memory_k), temporary(memory_v));
  expect_equal(cross.backward(dout, cross_kept), cross_expected);
}

TEST(MultiHeadBackwardTest, BadUpstreamGradientThrows) {
  MultiHeadAttention<double> mha(ModuleConfig(8, 2));
  const Tensor<double, 3> x({1, 3, 8});
  const auto fwd = mha.forward(x);
  test::expect_error<ShapeError>([&] { mha.backward(Tensor<double, 3>({1, 4, 8}), fwd); },
                                 {"[MultiHeadAttention::backward] dout:", "(1, 3, 8)", "(1, 4, 8)"});
  test::expect_error<std::invalid_argument>([&] { mha.backward(Tensor<double, 3>({1, 3, 8}), MhaForward<double>()); },
                                            {"fwd"});
}

// ---- linear_backward -------------------------------------------------------------------------------

TEST(LinearBackwardTest, GradientsMatchFiniteDifferences) {
  Random random(43);
  auto x = random.normal_tensor<double, 3>({2, 3, 5});
  auto w = random.normal_tensor<double, 2>({4, 5});
  auto b = random.normal_tensor<double, 1>({4});
  const auto upstream = random.normal_tensor<double, 3>({2, 3, 4});
  const auto loss = [&] { return weighted_sum(linear<double>(x, w, b), upstream); };
  const auto g = linear_backward<double>(x, w, upstream, true);
  EXPECT_TRUE(all_close(g.dx, numerical_gradient(x, loss), gradient_tolerance));
  EXPECT_TRUE(all_close(g.dweight, numerical_gradient(w, loss), gradient_tolerance));
  EXPECT_TRUE(all_close(g.dbias, numerical_gradient(b, loss), gradient_tolerance));
  EXPECT_EQ(linear_backward<double>(x, w, upstream, false).dbias.size(), 0);
  const Tensor<double, 3> wrong_upstream({2, 3, 5});
  test::expect_error<ShapeError>([&] { linear_backward<double>(x, w, wrong_upstream, true); },
                                 {"[linear_backward] dy:", "(2, 3, 4)"});
}

}  // namespace
}  // namespace selfattn::test
