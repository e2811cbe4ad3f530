// Tests of sdpa_backward: every gradient against central finite differences in double, over every mask
// kind, grouped-query heads, custom scale and dropout; plus its structural properties and errors.
#include <selfattn/attention.hpp>

#include "support/brute_force.hpp"
#include "support/compare.hpp"
#include "support/expect_error.hpp"
#include "support/gradcheck.hpp"
#include "support/random.hpp"
#include "support/scalars.hpp"

#include <gtest/gtest.h>

#include <limits>
#include <string>
#include <vector>

namespace selfattn::test {
namespace {

struct GradientCase {
  std::string name;
  Index batch, heads, kv_heads, q_len, k_len, head_dim, value_dim;
  Causal causal = Causal::none;
  bool key_lengths = false, allowed = false, bias = false, broadcast_bias = false, window = false, alibi = false,
       scale = false, dropout = false;
};

const std::vector<GradientCase> gradient_cases = {
    {"plain", 2, 2, 2, 4, 5, 3, 2},
    {"odd sizes", 1, 3, 3, 7, 3, 5, 4},
    {"gqa", 2, 4, 2, 3, 6, 4, 3},
    {"mqa causal", 1, 4, 1, 5, 5, 3, 3, Causal::top_left},
    {"bottom right, empty rows", 1, 2, 2, 6, 3, 4, 2, Causal::bottom_right},
    {"key lengths", 3, 2, 1, 4, 6, 3, 5, Causal::none, true},
    {"allowed", 2, 2, 2, 5, 5, 3, 3, Causal::none, false, true},
    {"bias", 2, 2, 1, 4, 5, 3, 3, Causal::none, false, false, true},
    {"broadcast bias", 2, 3, 3, 4, 5, 3, 3, Causal::none, false, false, true, true},
    {"window", 1, 2, 2, 7, 9, 3, 3, Causal::none, false, false, false, false, true},
    {"alibi + scale", 2, 2, 2, 5, 6, 4, 3, Causal::none, false, false, false, false, false, true, true},
    {"dropout", 2, 2, 1, 5, 6, 3, 4, Causal::none, false, false, false, false, false, false, false, true},
    {"everything", 2, 4, 2, 6, 7, 5, 3, Causal::bottom_right, true, true, true, true, true, true, true, true},
};

TEST(AttentionBackwardTest, GradientsMatchFiniteDifferences) {
  Random random(31);
  for (const GradientCase& c : gradient_cases) {
    SCOPED_TRACE(c.name);
    auto q = random.normal_tensor<double, 4>({c.batch, c.heads, c.q_len, c.head_dim});
    auto k = random.normal_tensor<double, 4>({c.batch, c.kv_heads, c.k_len, c.head_dim});
    auto v = random.normal_tensor<double, 4>({c.batch, c.kv_heads, c.k_len, c.value_dim});
    const auto upstream = random.normal_tensor<double, 4>({c.batch, c.heads, c.q_len, c.value_dim});
    Tensor<bool, 4> allowed;
    Tensor<double, 4> bias;
    AttentionOptions<double> opts;
    opts.causal = c.causal;
    if (c.key_lengths)
      for (Index b = 0; b < c.batch; ++b) opts.key_lengths.push_back(b == 0 ? c.k_len : random.integer(0, c.k_len));
    if (c.allowed) opts.allowed = allowed = random.bool_tensor<4>({c.batch, 1, c.q_len, c.k_len}, 0.7);
    if (c.bias)
      opts.bias = bias = random.normal_tensor<double, 4>(
          c.broadcast_bias ? std::array<Index, 4>{1, c.heads, 1, c.k_len} : std::array<Index, 4>{c.batch, c.heads, c.q_len, c.k_len});
    if (c.window) {
      opts.window_left = 2;
      opts.window_right = 1;
    }
    if (c.alibi)
      for (Index h = 0; h < c.heads; ++h) opts.alibi_slopes.push_back(0.1 * static_cast<double>(h + 1));
    if (c.scale) opts.scale = 0.7;
    if (c.dropout) {
      opts.dropout_p = 0.3;
      opts.seed = 77;
    }
    const auto loss = [&] { return weighted_sum(sdpa_forward(q, k, v, opts).out, upstream); };
    const auto fwd = sdpa_forward(q, k, v, opts);
    const auto g = sdpa_backward(q, k, v, fwd.out, fwd.lse, upstream, opts);
    EXPECT_TRUE(all_close(g.dq, numerical_gradient(q, loss), gradient_tolerance)) << "dq";
    EXPECT_TRUE(all_close(g.dk, numerical_gradient(k, loss), gradient_tolerance)) << "dk";
    EXPECT_TRUE(all_close(g.dv, numerical_gradient(v, loss), gradient_tolerance)) << "dv";
    if (c.bias) {
      EXPECT_EQ(g.dbias.shape(), bias.shape());
      EXPECT_TRUE(all_close(g.dbias, numerical_gradient(bias, loss), gradient_tolerance)) << "dbias";
    } else {
      EXPECT_EQ(g.dbias.size(), 0);
    }
  }
}

SELFATTN_SCALAR_TEST_SUITE(AttentionBackwardTyped);

// Fully masked rows, masked keys with NaN, and padding keys all get exactly zero gradient, never NaN.
TYPED_TEST(AttentionBackwardTyped, MaskedPositionsGetZeroGradientNeverNan) {
  using T = TypeParam;
  Random random(32);
  const auto q = random.normal_tensor<T, 4>({2, 2, 5, 4});
  auto k = random.normal_tensor<T, 4>({2, 2, 3, 4});
  auto v = random.normal_tensor<T, 4>({2, 2, 3, 4});
  const auto dout = random.normal_tensor<T, 4>({2, 2, 5, 4});
  AttentionOptions<T> opts;
  opts.causal = Causal::bottom_right;  // rows 0 and 1 see no key
  opts.key_lengths = {3, 2};           // key 2 of batch 1 is padding
  for (Index h = 0; h < 2; ++h)
    for (Index d = 0; d < 4; ++d) k(1, h, 2, d) = v(1, h, 2, d) = std::numeric_limits<T>::quiet_NaN();
  const auto fwd = sdpa_forward(q, k, v, opts);
  const auto g = sdpa_backward(q, k, v, fwd.out, fwd.lse, dout, opts);
  EXPECT_FALSE(test::has_nan(g.dq));
  EXPECT_FALSE(test::has_nan(g.dk));
  EXPECT_FALSE(test::has_nan(g.dv));
  for (Index b = 0; b < 2; ++b)
    for (Index h = 0; h < 2; ++h)
      for (Index d = 0; d < 4; ++d) {
        EXPECT_EQ(g.dq(b, h, 0, d), T(0));
        EXPECT_EQ(g.dq(b, h, 1, d), T(0));
      }
  for (Index h = 0; h < 2; ++h)
    for (Index d = 0; d < 4; ++d) {
      EXPECT_EQ(g.dk(1, h, 2, d), T(0));
      EXPECT_EQ(g.dv(1, h, 2, d), T(0));
    }
}

// A key/value head shared by a group of query heads gets the sum of the group's gradients.
TYPED_TEST(AttentionBackwardTyped, GroupedQueryGradientsAccumulateOverTheGroup) {
  using T = TypeParam;
  Random random(33);
  const Index B = 1, H = 4, Hkv = 2, L = 5, D = 3;
  const auto q = random.normal_tensor<T, 4>({B, H, L, D});
  const auto k = random.normal_tensor<T, 4>({B, Hkv, L, D});
  const auto v = random.normal_tensor<T, 4>({B, Hkv, L, D});
  const auto dout = random.normal_tensor<T, 4>({B, H, L, D});
  const Tensor<T, 4> k_repeated = test::repeat_kv_heads(k, H), v_repeated = test::repeat_kv_heads(v, H);
  const auto grouped_fwd = sdpa_forward(q, k, v);
  const auto grouped = sdpa_backward(q, k, v, grouped_fwd.out, grouped_fwd.lse, dout);
  const auto full_fwd = sdpa_forward(q, k_repeated, v_repeated);
  const auto full = sdpa_backward(q, k_repeated, v_repeated, full_fwd.out, full_fwd.lse, dout);
  const Tensor<T, 4> dk_summed = test::sum_kv_groups(full.dk, Hkv), dv_summed = test::sum_kv_groups(full.dv, Hkv);
  EXPECT_TRUE(all_close(grouped.dq, full.dq, test::default_tolerance<T>()));
  EXPECT_TRUE(all_close(grouped.dk, dk_summed, test::default_tolerance<T>()));
  EXPECT_TRUE(all_close(grouped.dv, dv_summed, test::default_tolerance<T>()));
}

TYPED_TEST(AttentionBackwardTyped, RepeatedCallsAreBitwiseEqual) {
  using T = TypeParam;
  Random random(34);
  const auto q = random.normal_tensor<T, 4>({1, 2, 9, 8});
  const auto k = random.normal_tensor<T, 4>({1, 2, 11, 8});
  const auto v = random.normal_tensor<T, 4>({1, 2, 11, 8});
  const auto dout = random.normal_tensor<T, 4>({1, 2, 9, 8});
  AttentionOptions<T> opts;
  opts.dropout_p = T(0.2);
  opts.seed = 3;
  const auto fwd = sdpa_forward(q, k, v, opts);
  const auto a = sdpa_backward(q, k, v, fwd.out, fwd.lse, dout, opts);
  const auto b = sdpa_backward(q, k, v, fwd.out, fwd.lse, dout, opts);
  EXPECT_TRUE(all_close(a.dq, b.dq, 0.0));
  EXPECT_TRUE(all_close(a.dk, b.dk, 0.0));
  EXPECT_TRUE(all_close(a.dv, b.dv, 0.0));
}

TYPED_TEST(AttentionBackwardTyped, BadShapesThrowNamingTheArgument) {
  using T = TypeParam;
  const Tensor<T, 4> q({2, 4, 5, 8}), k({2, 2, 6, 8}), v({2, 2, 6, 3}), out({2, 4, 5, 3});
  const Tensor<T, 3> lse({2, 4, 5});
  expect_error<ShapeError>([&] { sdpa_backward(q, k, v, Tensor<T, 4>({2, 4, 5, 8}), lse, out); },
                           {"[sdpa_backward] out:", "(2, 4, 5, 3)", "(2, 4, 5, 8)"});
  expect_error<ShapeError>([&] { sdpa_backward(q, k, v, out, Tensor<T, 3>({2, 4, 6}), out); }, {"lse:", "(2, 4, 5)"});
  expect_error<ShapeError>([&] { sdpa_backward(q, k, v, out, lse, Tensor<T, 4>({2, 4, 5, 2})); }, {"dout:"});
  expect_error<ShapeError>([&] { sdpa_backward(q, Tensor<T, 4>({2, 3, 6, 8}), v, out, lse, out); }, {"k:"});
  AttentionOptions<T> opts;
  opts.window_left = -3;
  expect_error<std::invalid_argument>([&] { sdpa_backward(q, k, v, out, lse, out, opts); }, {"opts.window_left"});
}

}  // namespace
}  // namespace selfattn::test
