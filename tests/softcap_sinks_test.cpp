// Logit soft-capping (opts.softcap) and sink logits (opts.sinks) on every kernel, forward and backward:
//
//   - the reference, fused and decode kernels (each decode path forced) against the brute force
//     (tests/support/brute_force.hpp: long double loops written from the definitions), over the shared sweep of
//     shapes and masks with a cap, sinks or both on top;
//   - the gradients (q, k, v, bias and sinks) against central finite differences in double, for both backwards;
//   - PyTorch's autograd through tests/fixtures/sdpa_*.txt (tests/pytorch/make_sdpa_fixtures.py), float64, 1e-10;
//   - the rules: a row with no allowed key and a sink gives 0 and lse = sink; the options' errors name them.
#include <selfattn/attention.hpp>

#include "support/brute_force.hpp"
#include "support/compare.hpp"
#include "support/expect_error.hpp"
#include "support/fixture.hpp"
#include "support/gradcheck.hpp"
#include "support/random.hpp"
#include "support/sanitizers.hpp"
#include "support/scalars.hpp"
#include "support/sweep.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

namespace selfattn::test {
namespace {

using detail::DecodePath;

SELFATTN_SCALAR_TEST_SUITE(SoftcapSinksTest);

enum class Variant { softcap, sinks, both };

// The sweep's shapes, without its two D = 128 ones (long double brute force), and shapes that cross the fused
// kernels' tiles (64 keys, 32-64 query rows) and the decode kernel's chunks (256 keys) with few rows.
std::vector<Shape> shapes() {
  std::vector<Shape> result;
  for (const Shape& s : sweep_shapes)
    if (s.head_dim != 128) result.push_back(s);
  result.push_back({1, 2, 1, 70, 140, 16, 12});
  result.push_back({2, 4, 2, 3, 530, 16, 9});
  result.push_back({1, 8, 1, 5, 300, 20, 20});
  return result;
}

template <typename T>
struct Case {
  Tensor<T, 4> q, k, v, dout;
  MaskedOptions<T> masks;
  std::string where;
};

// A cap between 0.5 and 3 (below the scores' spread, so that tanh bends many of them), and sinks drawn around the
// scores, one head without a sink (-inf) when there are several.
template <typename T>
void add_variant(Variant variant, const Shape& s, Random& random, AttentionOptions<T>& opts) {
  if (variant != Variant::sinks) opts.softcap = static_cast<T>(random.uniform(0.5, 3.0));
  if (variant != Variant::softcap) {
    for (Index h = 0; h < s.heads; ++h) opts.sinks.push_back(static_cast<T>(2 * random.uniform(-1.0, 1.0)));
    if (s.heads > 1) opts.sinks[1] = -std::numeric_limits<T>::infinity();
  }
}

template <typename T>
Case<T> make_case(const Shape& s, MaskKind kind, Variant variant, Random& random) {
  Case<T> c;
  c.q = random.normal_tensor<T, 4>({s.batch, s.heads, s.q_len, s.head_dim});
  c.k = random.normal_tensor<T, 4>({s.batch, s.kv_heads, s.k_len, s.head_dim});
  c.v = random.normal_tensor<T, 4>({s.batch, s.kv_heads, s.k_len, s.value_dim});
  c.dout = random.normal_tensor<T, 4>({s.batch, s.heads, s.q_len, s.value_dim});
  make_options(kind, s, random, c.masks);
  add_variant(variant, s, random, c.masks.opts);
  c.where = "B " + std::to_string(s.batch) + " H " + std::to_string(s.heads) + " Hkv " + std::to_string(s.kv_heads) +
            " Lq " + std::to_string(s.q_len) + " Lk " + std::to_string(s.k_len) + " D " + std::to_string(s.head_dim) +
            " Dv " + std::to_string(s.value_dim) + ", mask kind " + std::to_string(static_cast<int>(kind)) +
            ", variant " + std::to_string(static_cast<int>(variant));
  return c;
}

TYPED_TEST(SoftcapSinksTest, EveryKernelMatchesTheBruteForce) {
  using T = TypeParam;
  Random random(20261207);
  const std::vector<Shape> all_shapes = shapes();
  const double tolerance = default_tolerance<T>();
  int cases = 0;
  for (std::size_t si = 0; si < all_shapes.size(); ++si)
    for (std::size_t ki = 0; ki < mask_kinds.size(); ++ki) {
      const Variant variant = static_cast<Variant>((si + ki) % 3);
      const Case<T> c = make_case<T>(all_shapes[si], mask_kinds[ki], variant, random);
      if (!sweep_pair_runs(si, ki)) continue;
      SCOPED_TRACE(c.where);
      AttentionOptions<T> opts = c.masks.opts;
      const auto expected = brute_force_attention<T>(c.q, c.k, c.v, opts);
      const auto expected_g = brute_force_backward<T>(c.q, c.k, c.v, c.dout, opts);

      opts.kernel = Kernel::reference;  // with the weights, which only it has
      const auto reference = sdpa_forward(c.q, c.k, c.v, opts);
      EXPECT_TRUE(all_close(reference.out, expected.out, tolerance));
      EXPECT_TRUE(all_close(reference.lse, expected.lse, tolerance));
      EXPECT_TRUE(all_close(reference.weights, expected.weights, tolerance));
      opts.need_weights = false;
      for (Kernel backward : {Kernel::reference, Kernel::fused}) {
        opts.kernel = backward;
        SCOPED_TRACE(backward == Kernel::reference ? "reference backward" : "fused backward");
        const auto g = sdpa_backward(c.q, c.k, c.v, reference.out, reference.lse, c.dout, opts);
        EXPECT_TRUE(all_close(g.dq, expected_g.dq, tolerance));
        EXPECT_TRUE(all_close(g.dk, expected_g.dk, tolerance));
        EXPECT_TRUE(all_close(g.dv, expected_g.dv, tolerance));
        EXPECT_TRUE(all_close(g.dbias, expected_g.dbias, tolerance));
        EXPECT_TRUE(all_close(g.dsinks, expected_g.dsinks, tolerance));
      }

      opts.kernel = Kernel::fused;
      const auto fused = sdpa_forward(c.q, c.k, c.v, opts);
      EXPECT_TRUE(all_close(fused.out, expected.out, tolerance)) << "fused";
      EXPECT_TRUE(all_close(fused.lse, expected.lse, tolerance)) << "fused";

      const auto params = detail::make_params<T>(c.q, c.k, c.v, opts);
      for (DecodePath path : {DecodePath::general, DecodePath::grouped, DecodePath::streaming}) {
        SCOPED_TRACE("decode path " + std::to_string(static_cast<int>(path)));
        Tensor<T, 4> out(expected.out.shape());
        Tensor<T, 3> lse(expected.lse.shape());
        detail::decode_forward(params, detail::ForwardOutputs<T>{out.view(), lse.view(), {}}, path);
        EXPECT_TRUE(all_close(out, expected.out, tolerance));
        EXPECT_TRUE(all_close(lse, expected.lse, tolerance));
      }
      ++cases;
    }
  EXPECT_EQ(cases, sweep_pairs_run(all_shapes.size(), mask_kinds.size()));
}

// The fused forward and backward read the soft-capped scores through the level's tanh (kernels/vocabulary.inc), the
// reference through std::tanh: over scores from 0 to 30 times the cap, both sides of 1/2 (where the level's tanh
// changes formula) included, they agree to the float tolerance.
TYPED_TEST(SoftcapSinksTest, TheCapHoldsOverTheWholeRangeOfScores) {
  using T = TypeParam;
  Random random(7);
  for (double cap : {0.1, 1.0, 20.0}) {
    SCOPED_TRACE("cap " + std::to_string(cap));
    Tensor<T, 4> q = random.normal_tensor<T, 4>({1, 2, 70, 16}), k = random.normal_tensor<T, 4>({1, 2, 90, 16});
    const Tensor<T, 4> v = random.normal_tensor<T, 4>({1, 2, 90, 8}), dout = random.normal_tensor<T, 4>({1, 2, 70, 8});
    for (Index n = 0; n < q.size(); ++n) q.data()[n] *= static_cast<T>(1 + n % 5);  // rows of growing scores
    AttentionOptions<T> opts;
    opts.softcap = static_cast<T>(cap);
    const auto expected = brute_force_attention<T>(q, k, v, opts);
    const auto expected_g = brute_force_backward<T>(q, k, v, dout, opts);
    opts.kernel = Kernel::fused;
    const auto fwd = sdpa_forward(q, k, v, opts);
    const auto g = sdpa_backward(q, k, v, fwd.out, fwd.lse, dout, opts);
    EXPECT_TRUE(all_close(fwd.out, expected.out, default_tolerance<T>()));
    EXPECT_TRUE(all_close(fwd.lse, expected.lse, default_tolerance<T>()));
    EXPECT_TRUE(all_close(g.dq, expected_g.dq, default_tolerance<T>()));
    EXPECT_TRUE(all_close(g.dk, expected_g.dk, default_tolerance<T>()));
  }
}

// A row with no allowed key still has its sink: all of its weight goes there, so its output is 0 and its lse the
// sink, on every kernel; its gradients are 0, never NaN.
TYPED_TEST(SoftcapSinksTest, ARowWithoutKeysGivesZeroAndTheSinkAsLse) {
  using T = TypeParam;
  Random random(3);
  const Tensor<T, 4> q = random.normal_tensor<T, 4>({2, 2, 3, 4}), k = random.normal_tensor<T, 4>({2, 2, 5, 4});
  const Tensor<T, 4> v = random.normal_tensor<T, 4>({2, 2, 5, 4}), dout = random.normal_tensor<T, 4>({2, 2, 3, 4});
  AttentionOptions<T> opts;
  opts.key_lengths = {5, 0};  // batch 1 sees no key
  opts.sinks = {T(0.5), T(-1.25)};
  opts.softcap = T(2);
  for (Kernel kernel : {Kernel::reference, Kernel::fused, Kernel::decode}) {
    opts.kernel = kernel;
    SCOPED_TRACE("kernel " + std::to_string(static_cast<int>(kernel)));
    const auto fwd = sdpa_forward(q, k, v, opts);
    const auto g = sdpa_backward(q, k, v, fwd.out, fwd.lse, dout, opts);
    for (Index h = 0; h < 2; ++h)
      for (Index i = 0; i < 3; ++i) {
        EXPECT_EQ(fwd.lse(1, h, i), opts.sinks[static_cast<std::size_t>(h)]);
        for (Index e = 0; e < 4; ++e) {
          EXPECT_EQ(fwd.out(1, h, i, e), T(0));
          EXPECT_EQ(g.dq(1, h, i, e), T(0));
        }
        EXPECT_LT(fwd.lse(0, h, i), std::numeric_limits<T>::infinity());
      }
    for (Index n = 0; n < g.dk.size(); ++n) EXPECT_FALSE(std::isnan(g.dk.data()[n]));
    for (Index h = 0; h < 2; ++h) EXPECT_FALSE(std::isnan(g.dsinks(h)));
  }
}

// d/dq, dk, dv, dbias and dsinks of sum(dout * out) against central differences, with a cap, sinks, a bias, ALiBi,
// GQA, a bottom-right causal mask and a sequence whose rows see no key: both backward kernels.
TEST(SoftcapSinksGradients, MatchFiniteDifferences) {
  Random random(11);
  Tensor<double, 4> q = random.normal_tensor<double, 4>({2, 4, 3, 5}),
                    k = random.normal_tensor<double, 4>({2, 2, 6, 5});
  Tensor<double, 4> v = random.normal_tensor<double, 4>({2, 2, 6, 3});
  Tensor<double, 4> bias = random.normal_tensor<double, 4>({1, 4, 3, 6});
  const Tensor<double, 4> dout = random.normal_tensor<double, 4>({2, 4, 3, 3});
  for (Index n = 0; n < q.size(); ++n) q.data()[n] *= 2;  // scores beyond the cap
  AttentionOptions<double> opts;
  opts.softcap = 1.5;
  opts.sinks = {0.3, -0.7, 1.1, -std::numeric_limits<double>::infinity()};
  opts.alibi_slopes = {0.5, 0.25, 0.125, 0.0625};
  opts.causal = Causal::bottom_right;
  opts.key_lengths = {6, 4};
  opts.bias = bias;
  Tensor<double, 1> sinks({4});
  for (Index h = 0; h < 4; ++h) sinks(h) = opts.sinks[static_cast<std::size_t>(h)];
  const auto loss = [&] {
    AttentionOptions<double> o = opts;
    for (Index h = 0; h < 3; ++h) o.sinks[static_cast<std::size_t>(h)] = sinks(h);  // head 3 keeps -inf
    return weighted_sum(sdpa_forward(q, k, v, o).out, dout);
  };
  for (Kernel kernel : {Kernel::reference, Kernel::fused}) {
    SCOPED_TRACE(kernel == Kernel::reference ? "reference" : "fused");
    opts.kernel = kernel;
    const auto fwd = sdpa_forward(q, k, v, opts);
    const auto g = sdpa_backward(q, k, v, fwd.out, fwd.lse, dout, opts);
    expect_gradient("q", q, g.dq, loss);
    expect_gradient("k", k, g.dk, loss);
    expect_gradient("v", v, g.dv, loss);
    expect_gradient("bias", bias, g.dbias, loss);
    expect_gradient("sinks", sinks, g.dsinks, loss);
    EXPECT_EQ(g.dsinks(3), 0.0);  // a -inf sink has no weight, hence no gradient
  }
}

// PyTorch's autograd through the formulas (tests/pytorch/make_sdpa_fixtures.py): out, lse, weights and every gradient
// of every kernel within 1e-10 in float64.
class SoftcapSinksFixture : public ::testing::TestWithParam<const char*> {};

TEST_P(SoftcapSinksFixture, EveryKernelMatchesPyTorch) {
  const Fixture fx = load_fixture(fixture_path(std::string("sdpa_") + GetParam() + ".txt"));
  const Tensor<double, 4> q = fx.tensor<4>("q"), k = fx.tensor<4>("k"), v = fx.tensor<4>("v");
  const Tensor<double, 4> dout = fx.tensor<4>("dout");
  AttentionOptions<double> opts;
  opts.causal = static_cast<Causal>(fx.integer("causal"));
  if (fx.has("scale")) opts.scale = fx.values("scale").at(0);
  if (fx.has("softcap")) opts.softcap = fx.values("softcap").at(0);
  if (fx.has("sinks")) opts.sinks = fx.values("sinks");
  if (fx.has("alibi_slopes")) opts.alibi_slopes = fx.values("alibi_slopes");
  if (fx.has("key_lengths")) opts.key_lengths = fx.indices("key_lengths");
  Tensor<double, 4> bias;
  if (fx.has("bias")) {
    bias = fx.tensor<4>("bias");
    opts.bias = bias;
  }
  constexpr double tolerance = 1e-10;
  for (Kernel kernel : {Kernel::reference, Kernel::fused, Kernel::decode}) {
    SCOPED_TRACE("kernel " + std::to_string(static_cast<int>(kernel)));
    opts.kernel = kernel;
    opts.need_weights = kernel == Kernel::reference;
    const auto fwd = sdpa_forward(q, k, v, opts);
    EXPECT_TRUE(all_close(fwd.out, fx.tensor<4>("out"), tolerance));
    EXPECT_TRUE(all_close(fwd.lse, fx.tensor<3>("lse"), tolerance));
    if (opts.need_weights) {
      EXPECT_TRUE(all_close(fwd.weights, fx.tensor<4>("weights"), tolerance));
    }
    opts.need_weights = false;
    const auto g = sdpa_backward(q, k, v, fwd.out, fwd.lse, dout, opts);
    EXPECT_TRUE(all_close(g.dq, fx.tensor<4>("dq"), tolerance));
    EXPECT_TRUE(all_close(g.dk, fx.tensor<4>("dk"), tolerance));
    EXPECT_TRUE(all_close(g.dv, fx.tensor<4>("dv"), tolerance));
    if (fx.has("dbias")) {
      EXPECT_TRUE(all_close(g.dbias, fx.tensor<4>("dbias"), tolerance));
    }
    if (fx.has("dsinks")) {
      EXPECT_TRUE(all_close(g.dsinks, fx.tensor<1>("dsinks"), tolerance));
    }
    EXPECT_EQ(g.dsinks.size(), fx.has("dsinks") ? q.dim(1) : 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, SoftcapSinksFixture,
                         ::testing::Values("softcap_plain", "softcap_causal_bias_padding", "sinks_plain",
                                           "sinks_empty_rows", "softcap_sinks_alibi_gqa", "softcap_sinks_long"));

// The 16-bit calls take both options: their results are the float call's on the widened inputs, out rounded once.
TEST(SoftcapSinksHalf, Bfloat16FollowsTheFloatCall) {
  Random random(5);
  const Tensor<float, 4> q = random.normal_tensor<float, 4>({1, 4, 80, 32}),
                         k = random.normal_tensor<float, 4>({1, 2, 96, 32});
  const Tensor<float, 4> v = random.normal_tensor<float, 4>({1, 2, 96, 32});
  const Tensor<bfloat16, 4> q16 = tensor_cast<bfloat16>(q), k16 = tensor_cast<bfloat16>(k),
                            v16 = tensor_cast<bfloat16>(v);
  AttentionOptions<float> opts;
  opts.softcap = 1.0f;
  opts.sinks = {0.5f, 1.5f, -1.0f, 0.0f};
  opts.causal = Causal::top_left;
  for (Kernel kernel : {Kernel::fused, Kernel::decode, Kernel::reference}) {
    SCOPED_TRACE("kernel " + std::to_string(static_cast<int>(kernel)));
    opts.kernel = kernel;
    const auto half = sdpa_forward(q16, k16, v16, opts);
    const auto wide = sdpa_forward(tensor_cast<float>(q16), tensor_cast<float>(k16), tensor_cast<float>(v16), opts);
    EXPECT_TRUE(all_close(tensor_cast<float>(half.out), wide.out, 1.0 / 128));  // one bfloat16 rounding
    EXPECT_TRUE(all_close(half.lse, wide.lse, 1e-5));
  }
}

TEST(SoftcapSinksErrors, BadOptionsAreRejectedByName) {
  const Tensor<float, 4> q({1, 2, 3, 4}), k({1, 2, 5, 4}), v({1, 2, 5, 4});
  const float infinity = std::numeric_limits<float>::infinity();
  for (float cap : {-1.0f, infinity, std::nanf("")}) {
    AttentionOptions<float> opts;
    opts.softcap = cap;
    expect_error<std::invalid_argument>([&] { sdpa_forward(q, k, v, opts); }, {"sdpa_forward", "opts.softcap"});
  }
  AttentionOptions<float> opts;
  opts.sinks = {0.0f};
  expect_error<ShapeError>([&] { sdpa_forward(q, k, v, opts); }, {"opts.sinks", "expected 2", "got 1"});
  for (float sink : {infinity, std::nanf("")}) {
    opts.sinks = {0.0f, sink};
    expect_error<std::invalid_argument>([&] { sdpa_forward(q, k, v, opts); }, {"opts.sinks", "finite"});
  }
  opts.sinks = {0.0f, -infinity};  // -inf: that head has no sink
  EXPECT_NO_THROW(sdpa_forward(q, k, v, opts));
}

TEST(SoftcapSinksErrors, BackwardIntoNeedsExactlyTheSinksGradient) {
  Random random(9);
  const Tensor<double, 4> q = random.normal_tensor<double, 4>({1, 2, 3, 4}),
                          k = random.normal_tensor<double, 4>({1, 2, 5, 4});
  const Tensor<double, 4> v = random.normal_tensor<double, 4>({1, 2, 5, 4}),
                          dout = random.normal_tensor<double, 4>({1, 2, 3, 4});
  AttentionOptions<double> opts;
  opts.sinks = {0.25, -0.5};
  const auto fwd = sdpa_forward(q, k, v, opts);
  Tensor<double, 4> dq(q.shape()), dk(k.shape()), dv(v.shape());
  Tensor<double, 1> dsinks({2}), wrong({3});
  expect_error<ShapeError>(
      [&] {
        sdpa_backward_into(q, k, v, fwd.out, fwd.lse, dout, {dq, dk, dv}, opts);
      },
      {"sdpa_backward_into", "grads.dsinks"});
  expect_error<ShapeError>(
      [&] {
        sdpa_backward_into(q, k, v, fwd.out, fwd.lse, dout, {dq, dk, dv, {}, wrong}, opts);
      },
      {"grads.dsinks"});
  sdpa_backward_into(q, k, v, fwd.out, fwd.lse, dout, {dq, dk, dv, {}, dsinks}, opts);
  const auto g = sdpa_backward(q, k, v, fwd.out, fwd.lse, dout, opts);
  EXPECT_TRUE(all_close(dsinks, g.dsinks, 0.0));
  AttentionOptions<double> no_sinks;
  const auto plain = sdpa_forward(q, k, v, no_sinks);
  expect_error<std::invalid_argument>(
      [&] {
        sdpa_backward_into(q, k, v, plain.out, plain.lse, dout, {dq, dk, dv, {}, dsinks}, no_sinks);
      },
      {"grads.dsinks", "without opts.sinks"});
}

}  // namespace
}  // namespace selfattn::test
