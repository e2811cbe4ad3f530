// Tests of multihead.hpp: PyTorch conformance, the defining properties of self-attention (permutation
// equivariance, and its loss once positions are added), the module against its parts, and errors.
#include <selfattn/selfattn.hpp>

#include "support/brute_force.hpp"
#include "support/compare.hpp"
#include "support/expect_error.hpp"
#include "support/module_by_hand.hpp"
#include "support/module_config.hpp"
#include "support/pytorch_case.hpp"
#include "support/random.hpp"
#include "support/scalars.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

namespace selfattn::test {
namespace {

// ---- PyTorch conformance -------------------------------------------------------------------------

class PyTorchConformance : public ::testing::TestWithParam<std::string> {};

TEST_P(PyTorchConformance, OutputAndPerHeadWeightsMatchNnMultiheadAttention) {
  test::PyTorchCase c(GetParam());
  c.opts.need_weights = true;
  const MhaForward<double> fwd = c.self_attention ? c.mha.forward(c.query, c.opts) : c.mha.forward(c.query, c.key, c.value, c.opts);
  EXPECT_TRUE(all_close(fwd.output, c.fx.tensor<3>("output"), 1e-10));
  EXPECT_TRUE(all_close(fwd.weights, c.fx.tensor<4>("weights"), 1e-10));
}

// The same fixtures without weights, on every forward kernel: automatic (fused, or decode for few query rows),
// each forced. need_weights = true above runs the reference kernel, so this is what checks the default path.
TEST_P(PyTorchConformance, OutputMatchesNnMultiheadAttentionOnEveryKernel) {
  test::PyTorchCase c(GetParam());
  for (Kernel kernel : {Kernel::automatic, Kernel::fused, Kernel::decode, Kernel::reference}) {
    SCOPED_TRACE("kernel " + std::to_string(static_cast<int>(kernel)));
    AttentionOptions<double> opts = c.opts;
    opts.kernel = kernel;
    const MhaForward<double> fwd = c.self_attention ? c.mha.forward(c.query, opts) : c.mha.forward(c.query, c.key, c.value, opts);
    EXPECT_TRUE(all_close(fwd.output, c.fx.tensor<3>("output"), 1e-10));
    EXPECT_EQ(fwd.weights.size(), 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, PyTorchConformance,
                         ::testing::Values("self_basic", "key_padding", "attn_mask_bool", "attn_mask_float",
                                           "attn_mask_float3d", "cross_kdim_vdim", "no_bias", "combined", "causal"));

// ---- helpers -------------------------------------------------------------------------------------

SELFATTN_SCALAR_TEST_SUITE(MultiHeadTest);

// Rows of x (B, L, E) reordered: result row l is x row order[l], in every batch.
template <typename T>
Tensor<T, 3> permute_rows(const Tensor<T, 3>& x, const std::vector<Index>& order) {
  Tensor<T, 3> y(x.shape());
  for (Index b = 0; b < x.dim(0); ++b)
    for (Index l = 0; l < x.dim(1); ++l)
      for (Index e = 0; e < x.dim(2); ++e) y(b, l, e) = x(b, order[static_cast<std::size_t>(l)], e);
  return y;
}

std::vector<Index> random_permutation(Index n, Random& random) {
  std::vector<Index> order(static_cast<std::size_t>(n));
  for (Index i = 0; i < n; ++i) order[static_cast<std::size_t>(i)] = i;
  std::shuffle(order.begin(), order.end(), random.engine());
  return order;
}

template <typename T>
Tensor<T, 3> add_positions(const Tensor<T, 3>& x) {
  const Tensor<T, 2> pe = sinusoidal_encoding<T>(x.dim(1), x.dim(2));
  Tensor<T, 3> y = x;
  for (Index b = 0; b < x.dim(0); ++b)
    for (Index l = 0; l < x.dim(1); ++l)
      for (Index e = 0; e < x.dim(2); ++e) y(b, l, e) += pe(l, e);
  return y;
}

// ---- the defining property -----------------------------------------------------------------------

// SelfAttn(P X) = P SelfAttn(X): attention without positions sees a set, not a sequence.
TYPED_TEST(MultiHeadTest, SelfAttentionIsPermutationEquivariant) {
  using T = TypeParam;
  Random random(1);
  MultiHeadAttention<T> mha(ModuleConfig(16, 4), 3);
  mha.params().q_bias = random.normal_tensor<T, 1>({16});  // non-zero biases take part too
  mha.params().out_bias = random.normal_tensor<T, 1>({16});
  const auto x = random.normal_tensor<T, 3>({2, 7, 16});
  for (int trial = 0; trial < 5; ++trial) {
    const auto order = random_permutation(7, random);
    const auto permuted_then_attended = mha.forward(permute_rows(x, order)).output;
    const auto attended_then_permuted = permute_rows(mha.forward(x).output, order);
    EXPECT_TRUE(all_close(permuted_then_attended, attended_then_permuted, default_tolerance<T>()));
  }
}

// Adding sinusoidal positions to X (positions stay with the slots while tokens move) breaks it.
TYPED_TEST(MultiHeadTest, SinusoidalPositionsBreakPermutationEquivariance) {
  using T = TypeParam;
  Random random(2);
  MultiHeadAttention<T> mha(ModuleConfig(16, 4), 3);
  const auto x = random.normal_tensor<T, 3>({2, 7, 16});
  const std::vector<Index> order = {3, 0, 6, 1, 5, 2, 4};
  const auto permuted = mha.forward(add_positions(permute_rows(x, order))).output;
  const auto unpermuted = permute_rows(mha.forward(add_positions(x)).output, order);
  EXPECT_GT(test::max_abs_difference(permuted, unpermuted), 1e-2);
}

TYPED_TEST(MultiHeadTest, RotaryPositionsBreakPermutationEquivariance) {
  using T = TypeParam;
  Random random(3);
  MultiHeadAttention<T> mha(ModuleConfig(16, 4).rope(4), 3);
  const auto x = random.normal_tensor<T, 3>({2, 7, 16}, 2.0);
  const std::vector<Index> order = {3, 0, 6, 1, 5, 2, 4};
  const auto permuted = mha.forward(permute_rows(x, order)).output;
  const auto unpermuted = permute_rows(mha.forward(x).output, order);
  EXPECT_GT(test::max_abs_difference(permuted, unpermuted), 1e-2);
}

// Cross-attention: permuting keys and values together (the same permutation) changes nothing.
TYPED_TEST(MultiHeadTest, CrossAttentionIsInvariantToJointKeyValuePermutation) {
  using T = TypeParam;
  Random random(4);
  MultiHeadAttention<T> mha(ModuleConfig(12, 3).input_dims(5, 7), 9);
  const auto query = random.normal_tensor<T, 3>({2, 4, 12});
  const auto key = random.normal_tensor<T, 3>({2, 9, 5});
  const auto value = random.normal_tensor<T, 3>({2, 9, 7});
  const auto order = random_permutation(9, random);
  AttentionOptions<T> opts;
  opts.need_weights = true;
  const auto plain = mha.forward(query, key, value, opts);
  const auto shuffled = mha.forward(query, permute_rows(key, order), permute_rows(value, order), opts);
  EXPECT_TRUE(all_close(shuffled.output, plain.output, default_tolerance<T>()));
  // The weights move with their keys: shuffled column j is plain column order[j].
  for (Index h = 0; h < 3; ++h)
    for (Index i = 0; i < 4; ++i)
      for (Index j = 0; j < 9; ++j)
        EXPECT_NEAR(shuffled.weights(1, h, i, j), plain.weights(1, h, i, order[static_cast<std::size_t>(j)]),
                    default_tolerance<T>());
}

TYPED_TEST(MultiHeadTest, CausalRowIgnoresLaterTokens) {
  using T = TypeParam;
  Random random(5);
  MultiHeadAttention<T> mha(ModuleConfig(8, 2), 1);
  auto x = random.normal_tensor<T, 3>({1, 6, 8});
  AttentionOptions<T> opts;
  opts.causal = Causal::top_left;
  const auto before = mha.forward(x, opts).output;
  for (Index e = 0; e < 8; ++e) x(0, 4, e) += T(3);  // change token 4
  const auto after = mha.forward(x, opts).output;
  for (Index l = 0; l < 4; ++l)
    for (Index e = 0; e < 8; ++e) EXPECT_EQ(after(0, l, e), before(0, l, e)) << "row " << l;
  EXPECT_GT(test::max_abs_difference(after, before), 1e-3);
}

// ---- the module against its parts ----------------------------------------------------------------

TYPED_TEST(MultiHeadTest, ModuleMatchesItsPartsAcrossConfigurations) {
  using T = TypeParam;
  Random random(6);
  struct Case {
    Index E, H, Hkv, kdim, vdim, rope_dim;
    RopeStyle style;
    bool alibi, bias;
    Index Lq, Lk;
    Causal causal;
  };
  const std::vector<Case> cases = {
      {16, 4, 0, 0, 0, 0, RopeStyle::half, false, true, 5, 5, Causal::none},
      {16, 4, 2, 0, 0, 4, RopeStyle::half, false, true, 6, 6, Causal::top_left},         // GQA + partial RoPE
      {16, 4, 1, 0, 0, 4, RopeStyle::interleaved, true, false, 3, 7, Causal::bottom_right},  // MQA, cross, ALiBi
      {12, 3, 3, 5, 7, 2, RopeStyle::half, false, true, 4, 9, Causal::none},              // kdim, vdim, RoPE
      {18, 6, 3, 0, 0, 0, RopeStyle::half, true, true, 7, 7, Causal::top_left},           // ALiBi, 6 heads
  };
  for (const Case& c : cases) {
    MultiHeadAttention<T> mha(ModuleConfig(c.E, c.H)
                                  .kv_heads(c.Hkv)
                                  .input_dims(c.kdim, c.vdim)
                                  .rope(c.rope_dim, c.style)
                                  .with_alibi(c.alibi)
                                  .with_bias(c.bias),
                              7);
    randomize_biases(mha, random);
    const auto query = random.normal_tensor<T, 3>({2, c.Lq, c.E});
    const auto key = random.normal_tensor<T, 3>({2, c.Lk, mha.config().kdim});
    const auto value = random.normal_tensor<T, 3>({2, c.Lk, mha.config().vdim});
    AttentionOptions<T> opts;
    opts.causal = c.causal;
    opts.key_lengths = {c.Lk, c.Lk - 1};
    const std::string where = "case #" + std::to_string(&c - cases.data());
    EXPECT_TRUE(all_close(mha.forward(query, key, value, opts).output, module_by_hand(mha, query, key, value, opts),
                          default_tolerance<T>()))
        << where;
    if (c.Lq == c.Lk && c.kdim == 0 && c.vdim == 0) {  // the fused Q|K|V projection path
      EXPECT_TRUE(all_close(mha.forward(query, opts).output, module_by_hand(mha, query, query, query, opts),
                            default_tolerance<T>()))
          << where << " (self-attention)";
    }
  }
}

// The fused Q|K|V GEMM (query, key and value are the same tensor) equals three separate projections.
TYPED_TEST(MultiHeadTest, FusedProjectionEqualsSeparateProjections) {
  using T = TypeParam;
  Random random(7);
  MultiHeadAttention<T> mha(ModuleConfig(16, 4).kv_heads(2), 2);
  const auto x = random.normal_tensor<T, 3>({2, 9, 16});
  const Tensor<T, 3> copy = x;  // different memory: takes the three-GEMM path
  EXPECT_TRUE(all_close(mha.forward(x).output, mha.forward(x, copy, copy).output, default_tolerance<T>()));
}

// With RoPE, a query block at the end of the keys sits at the last positions (bottom-right alignment):
// attending with the last query row alone equals the last row of full self-attention.
TYPED_TEST(MultiHeadTest, RopeQueryPositionsAreBottomRightAligned) {
  using T = TypeParam;
  Random random(8);
  MultiHeadAttention<T> mha(ModuleConfig(16, 2).rope(8), 4);
  const auto x = random.normal_tensor<T, 3>({1, 6, 16});
  const TensorView<const T, 3> last(x.data() + 5 * 16, {1, 1, 16});
  const auto full = mha.forward(x).output;
  const auto tail = mha.forward(last, x, x).output;
  for (Index e = 0; e < 16; ++e) EXPECT_NEAR(tail(0, 0, e), full(0, 5, e), default_tolerance<T>());
}

TYPED_TEST(MultiHeadTest, AlibiConfigEqualsAlibiOption) {
  using T = TypeParam;
  Random random(9);
  MultiHeadAttentionConfig cfg = ModuleConfig(12, 6);
  MultiHeadAttention<T> plain(cfg, 5);
  cfg.alibi = true;
  MultiHeadAttention<T> with_alibi(cfg, 5);
  const auto x = random.normal_tensor<T, 3>({1, 8, 12});
  AttentionOptions<T> opts;
  opts.alibi_slopes = alibi_slopes<T>(6);
  EXPECT_TRUE(all_close(with_alibi.forward(x).output, plain.forward(x, opts).output, 0.0));
  EXPECT_GT(test::max_abs_difference(with_alibi.forward(x).output, plain.forward(x).output), 1e-4);
  EXPECT_THROW(with_alibi.forward(x, opts), std::invalid_argument);  // ALiBi twice
}

TYPED_TEST(MultiHeadTest, PerHeadWeightsOnRequest) {
  using T = TypeParam;
  Random random(10);
  MultiHeadAttention<T> mha(ModuleConfig(8, 2), 1);
  const auto x = random.normal_tensor<T, 3>({2, 5, 8});
  AttentionOptions<T> opts;
  EXPECT_EQ(mha.forward(x, opts).weights.size(), 0);
  opts.need_weights = true;
  opts.key_lengths = {5, 3};
  const auto w = mha.forward(x, opts).weights;
  ASSERT_EQ(w.shape(), (std::array<Index, 4>{2, 2, 5, 5}));
  for (Index h = 0; h < 2; ++h)
    for (Index i = 0; i < 5; ++i) {
      T sum = 0;
      for (Index j = 0; j < 5; ++j) sum += w(1, h, i, j);
      EXPECT_NEAR(sum, T(1), default_tolerance<T>());
      EXPECT_EQ(w(1, h, i, 3), T(0));
      EXPECT_EQ(w(1, h, i, 4), T(0));
    }
}

TYPED_TEST(MultiHeadTest, DropoutOnlyInTrainingMode) {
  using T = TypeParam;
  Random random(11);
  MultiHeadAttention<T> mha(ModuleConfig(8, 2).with_dropout(0.5), 1);
  const auto x = random.normal_tensor<T, 3>({1, 6, 8});
  AttentionOptions<T> opts;
  opts.dropout_p = T(0.5);  // cfg.dropout's value: accepted, and applied in training mode only
  const auto eval = mha.forward(x, opts).output;
  EXPECT_TRUE(all_close(eval, mha.forward(x).output, 0.0));
  mha.set_training(true);
  opts.seed = 3;
  const auto train = mha.forward(x, opts).output;
  EXPECT_GT(test::max_abs_difference(train, eval), 1e-3);
  EXPECT_TRUE(all_close(mha.forward(x, opts).output, train, 0.0)) << "same seed, same dropout";
}

TYPED_TEST(MultiHeadTest, InitialisationIsSeededXavierUniformWithZeroBiases) {
  using T = TypeParam;
  MultiHeadAttentionConfig cfg = ModuleConfig(32, 4);
  cfg.kdim = 16;
  const MultiHeadAttention<T> a(cfg, 1), b(cfg, 1), c(cfg, 2);
  EXPECT_TRUE(all_close(a.params().q_weight, b.params().q_weight, 0.0));
  EXPECT_FALSE(all_close(a.params().q_weight, c.params().q_weight, 1e-3));
  const auto within = [](const Tensor<T, 2>& w, double bound) {
    double largest = 0, sum_squares = 0;
    for (Index n = 0; n < w.size(); ++n) {
      largest = std::max(largest, std::abs(static_cast<double>(w.data()[n])));
      sum_squares += static_cast<double>(w.data()[n]) * static_cast<double>(w.data()[n]);
    }
    // Uniform(-bound, bound) has variance bound^2 / 3.
    return largest <= bound && std::abs(sum_squares / static_cast<double>(w.size()) - bound * bound / 3) < 0.2 * bound * bound / 3;
  };
  EXPECT_TRUE(within(a.params().q_weight, std::sqrt(6.0 / 64)));
  EXPECT_TRUE(within(a.params().k_weight, std::sqrt(6.0 / 48)));
  EXPECT_TRUE(within(a.params().out_weight, 1.0 / std::sqrt(32.0)));
  for (const Tensor<T, 1>* bias : {&a.params().q_bias, &a.params().k_bias, &a.params().v_bias, &a.params().out_bias}) {
    ASSERT_EQ(bias->size(), 32);
    for (Index n = 0; n < 32; ++n) EXPECT_EQ(bias->data()[n], T(0));
  }
  cfg.bias = false;
  EXPECT_EQ(MultiHeadAttention<T>(cfg).params().q_bias.size(), 0);
}

// The documented default (API.md: `MultiHeadAttention<float> mha(cfg); // ... seed 0`), pinned: a module built
// without a seed is the seed-0 module bit for bit, so two unseeded modules are identical (the docs warn about it);
// another seed gives other weights in every matrix.
TYPED_TEST(MultiHeadTest, DefaultSeedIsZeroSoUnseededModulesAreIdentical) {
  using T = TypeParam;
  const MultiHeadAttentionConfig cfg = ModuleConfig(16, 4);
  const MultiHeadAttention<T> a(cfg), b(cfg), zero(cfg, 0), one(cfg, 1);
  const auto weights = [](const MultiHeadAttention<T>& m) {
    const MhaParams<T>& p = m.params();
    return std::vector<const Tensor<T, 2>*>{&p.q_weight, &p.k_weight, &p.v_weight, &p.out_weight};
  };
  for (std::size_t n = 0; n < 4; ++n) {
    SCOPED_TRACE("weight matrix " + std::to_string(n));
    EXPECT_EQ(test::max_abs_difference(*weights(a)[n], *weights(b)[n]), 0.0);
    EXPECT_EQ(test::max_abs_difference(*weights(a)[n], *weights(zero)[n]), 0.0);
    EXPECT_GT(test::max_abs_difference(*weights(a)[n], *weights(one)[n]), 0.0);
  }
}

TYPED_TEST(MultiHeadTest, StridedInputViewsEqualContiguousCopies) {
  using T = TypeParam;
  Random random(12);
  MultiHeadAttention<T> mha(ModuleConfig(8, 2), 1);
  const auto wide = random.normal_tensor<T, 3>({2, 5, 24});  // x is the middle 8 columns of each row
  const TensorView<const T, 3> x(wide.data() + 8, {2, 5, 8}, {5 * 24, 24, 1});
  const Tensor<T, 3> copy(x);
  EXPECT_TRUE(all_close(mha.forward(x).output, mha.forward(copy).output, default_tolerance<T>()));
}

// ---- errors ----------------------------------------------------------------------------------------

TYPED_TEST(MultiHeadTest, BadConfigurationsThrowNamingTheField) {
  using T = TypeParam;
  const auto make = [](auto change) {
    return [change] {
      MultiHeadAttentionConfig cfg = ModuleConfig(16, 4);
      change(cfg);
      MultiHeadAttention<T> mha(cfg);
    };
  };
  expect_error<std::invalid_argument>(make([](auto& c) { c.embed_dim = 0; }), {"cfg.embed_dim"});
  expect_error<std::invalid_argument>(make([](auto& c) { c.num_heads = 3; }), {"cfg.num_heads", "16", "3"});
  expect_error<std::invalid_argument>(make([](auto& c) { c.num_kv_heads = 3; }), {"cfg.num_kv_heads", "3"});
  expect_error<std::invalid_argument>(make([](auto& c) { c.kdim = -1; }), {"cfg.kdim"});
  expect_error<std::invalid_argument>(make([](auto& c) { c.vdim = -2; }), {"cfg.vdim"});
  expect_error<std::invalid_argument>(make([](auto& c) { c.dropout = 1.0; }), {"cfg.dropout"});
  expect_error<std::invalid_argument>(make([](auto& c) { c.rope_dim = 3; }), {"cfg.rope_dim"});
  expect_error<std::invalid_argument>(make([](auto& c) { c.rope_dim = 6; }), {"cfg.rope_dim", "head_dim = 4"});
  expect_error<std::invalid_argument>(make([](auto& c) { c.rope_base = 0; }), {"cfg.rope_base"});
}

TYPED_TEST(MultiHeadTest, BadInputsThrowBeforeAnyWork) {
  using T = TypeParam;
  MultiHeadAttention<T> mha(ModuleConfig(8, 2).input_dims(6, 0));
  const Tensor<T, 3> query({2, 4, 8}), key({2, 5, 6}), value({2, 5, 8});
  expect_error<ShapeError>([&] { mha.forward(Tensor<T, 3>({2, 4, 7}), key, value); },
                           {"[MultiHeadAttention::forward]", "query", "(*, *, 8)", "(2, 4, 7)"});
  expect_error<ShapeError>([&] { mha.forward(query, Tensor<T, 3>({2, 5, 8}), value); }, {"key", "(2, *, 6)", "(2, 5, 8)"});
  expect_error<ShapeError>([&] { mha.forward(query, key, Tensor<T, 3>({2, 4, 8})); }, {"value", "(2, 5, 8)", "(2, 4, 8)"});
  expect_error<ShapeError>([&] { mha.forward(query, Tensor<T, 3>({3, 5, 6}), value); }, {"key", "(3, 5, 6)"});
  AttentionOptions<T> opts;
  opts.key_lengths = {1, 2, 3};
  expect_error<ShapeError>([&] { mha.forward(query, key, value, opts); }, {"opts.key_lengths"});
  const Tensor<bool, 4> mask({2, 2, 4, 4});
  AttentionOptions<T> masked;
  masked.allowed = mask;
  expect_error<ShapeError>([&] { mha.forward(query, key, value, masked); }, {"opts.allowed", "(2, 2, 4, 5)"});
  mha.params().k_weight = Tensor<T, 2>({8, 8});  // no longer (8, kdim)
  expect_error<ShapeError>([&] { mha.forward(query, key, value); }, {"params().k_weight", "(8, 6)", "(8, 8)"});
}

// A PyTorch user's masks as they are: a 2-D (Lq, Lk) boolean mask and a 3-D (H, Lq, Lk) bias give the module's
// output and weights of their rank-4 views (1, 1, Lq, Lk) and (1, H, Lq, Lk) over the same memory, bit for bit.
TYPED_TEST(MultiHeadTest, MasksOfRankTwoAndThreeEqualTheirRankFourViews) {
  using T = TypeParam;
  Random random(15);
  MultiHeadAttention<T> mha(ModuleConfig(8, 2), 1);
  const auto x = random.normal_tensor<T, 3>({2, 5, 8});
  const Tensor<bool, 2> allowed = random.bool_tensor<2>({5, 5}, 0.7);
  const Tensor<T, 3> bias = random.normal_tensor<T, 3>({2, 5, 5});
  AttentionOptions<T> low, full;
  low.allowed = allowed;
  low.bias = bias;
  full.allowed = TensorView<const bool, 4>(allowed.data(), {1, 1, 5, 5});
  full.bias = TensorView<const T, 4>(bias.data(), {1, 2, 5, 5});
  low.need_weights = full.need_weights = true;
  const MhaForward<T> from_low = mha.forward(x, low), from_full = mha.forward(x, full);
  EXPECT_TRUE(all_close(from_low.output, from_full.output, 0.0));
  EXPECT_TRUE(all_close(from_low.weights, from_full.weights, 0.0));
  EXPECT_EQ(from_low.weights(1, 1, 2, 3) == T(0), !allowed(2, 3)) << "the mask reaches every batch entry and head";
}

// The module's dropout rate is cfg.dropout (training mode only): opts.dropout_p is accepted at 0 or at exactly that
// rate; any other value, which the module would silently ignore, throws naming it before anything is written.
TYPED_TEST(MultiHeadTest, ForwardRefusesADropoutRateItWouldIgnore) {
  using T = TypeParam;
  Random random(13);
  MultiHeadAttention<T> mha(ModuleConfig(8, 2).with_dropout(0.25), 1);
  const auto x = random.normal_tensor<T, 3>({2, 5, 8});
  for (bool training : {false, true}) {
    SCOPED_TRACE(training ? "training" : "eval");
    mha.set_training(training);
    AttentionOptions<T> opts;
    opts.seed = 4;
    const Tensor<T, 3> expected = mha.forward(x, opts).output;
    opts.dropout_p = T(0.25);  // the module's own rate: the same call
    EXPECT_TRUE(all_close(mha.forward(x, opts).output, expected, 0.0));
    opts.dropout_p = T(0.5);
    const std::vector<std::string> message{"opts.dropout_p", "cfg.dropout = 0.250000",
                                           training ? "this call: 0.250000" : "this call: 0.000000", "got 0.500000"};
    const auto named = [&](const char* function) {
      std::vector<std::string> fragments = message;
      fragments.push_back(function);
      return fragments;
    };
    expect_error<std::invalid_argument>([&] { mha.forward(x, opts); }, named("[MultiHeadAttention::forward]"));
    expect_error<std::invalid_argument>([&] { mha.forward(x, x, x, opts); }, named("[MultiHeadAttention::forward]"));
    expect_error<std::invalid_argument>([&] { mha.forward_with(mha.params(), x, opts); },
                                        named("[MultiHeadAttention::forward]"));
    MhaWorkspace<T> ws;
    Tensor<T, 3> y(x.shape());
    y.fill(T(7));
    expect_error<std::invalid_argument>([&] { mha.forward_into(x, x, x, y, ws, opts); },
                                        named("[MultiHeadAttention::forward_into]"));
    EXPECT_TRUE(std::all_of(y.data(), y.data() + y.size(), [](T value) { return value == T(7); }))
        << "nothing written on error";
  }
}

// step attends with Causal::bottom_right over the cache, without dropout and without weights: options asking for
// anything else throw naming themselves, before the cache or the output is touched; the values step uses pass.
TYPED_TEST(MultiHeadTest, StepRefusesOptionsItWouldIgnore) {
  using T = TypeParam;
  Random random(14);
  MultiHeadAttention<T> mha(ModuleConfig(8, 2), 1);
  const auto prompt = random.normal_tensor<T, 3>({1, 4, 8});
  const auto token = random.normal_tensor<T, 3>({1, 1, 8});
  auto cache = mha.make_cache(1), plain = mha.make_cache(1);
  mha.step(prompt, cache);
  mha.step(prompt, plain);
  AttentionOptions<T> weights, top_left, dropout;
  weights.need_weights = true;
  top_left.causal = Causal::top_left;
  dropout.dropout_p = T(0.1);
  const std::vector<std::pair<AttentionOptions<T>, std::vector<std::string>>> cases{
      {weights, {"opts.need_weights", "expected false, got true"}},
      {top_left, {"opts.causal", "Causal::bottom_right", "got Causal::top_left"}},
      {dropout, {"opts.dropout_p", "expected 0, got 0.100000"}}};
  Tensor<T, 3> y({1, 1, 8});
  y.fill(T(7));
  for (const auto& refused : cases) {  // not a structured binding: C++17 lambdas cannot capture those
    const AttentionOptions<T>& opts = refused.first;
    SCOPED_TRACE(refused.second[0]);
    std::vector<std::string> step_fragments = refused.second, into_fragments = refused.second;
    step_fragments.push_back("[MultiHeadAttention::step]");
    into_fragments.push_back("[MultiHeadAttention::step_into]");
    expect_error<std::invalid_argument>([&] { mha.step(token, cache, opts); }, step_fragments);
    expect_error<std::invalid_argument>([&] { mha.step_into(token, cache, y, opts); }, into_fragments);
  }
  EXPECT_EQ(cache.length(), 4) << "a refused step leaves the cache as it was";
  EXPECT_TRUE(std::all_of(y.data(), y.data() + y.size(), [](T value) { return value == T(7); }));
  AttentionOptions<T> bottom_right;
  bottom_right.causal = Causal::bottom_right;  // what step uses: accepted, the same call as the default
  EXPECT_TRUE(all_close(mha.step(token, cache, bottom_right), mha.step(token, plain), 0.0));
}

}  // namespace
}  // namespace selfattn::test
