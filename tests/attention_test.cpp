// Tests of attention.hpp and the reference kernel: a sweep against the brute-force semantics of API.md,
// the properties every attention must have, and every validation error.
#include <selfattn/attention.hpp>

#include "support/brute_force.hpp"
#include "support/compare.hpp"
#include "support/expect_error.hpp"
#include "support/random.hpp"
#include "support/sanitizers.hpp"
#include "support/scalars.hpp"
#include "support/sweep.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

namespace selfattn::test {
namespace {

SELFATTN_SCALAR_TEST_SUITE(AttentionTest);

TYPED_TEST(AttentionTest, ReferenceMatchesBruteForceOverSweep) {
  using T = TypeParam;
  Random random(20261129);
  int cases = 0;
  for (std::size_t si = 0; si < sweep_shapes.size(); ++si)
    for (std::size_t ki = 0; ki < mask_kinds.size(); ++ki) {
      if (!test::sweep_pair_runs(si, ki)) continue;  // a third of the pairs under a sanitizer
      const Shape& s = sweep_shapes[si];
      const MaskKind kind = mask_kinds[ki];
      const auto q = random.normal_tensor<T, 4>({s.batch, s.heads, s.q_len, s.head_dim});
      const auto k = random.normal_tensor<T, 4>({s.batch, s.kv_heads, s.k_len, s.head_dim});
      const auto v = random.normal_tensor<T, 4>({s.batch, s.kv_heads, s.k_len, s.value_dim});
      MaskedOptions<T> m;
      make_options(kind, s, random, m);
      const auto fwd = sdpa_forward(q, k, v, m.opts);
      const auto expected = test::brute_force_attention<T>(q, k, v, m.opts);
      const std::string where = "shape #" + std::to_string(&s - sweep_shapes.data()) + ", mask kind " +
                                std::to_string(static_cast<int>(kind));
      const double tolerance = default_tolerance<T>();
      EXPECT_TRUE(all_close(fwd.out, expected.out, tolerance)) << where;
      EXPECT_TRUE(all_close(fwd.lse, expected.lse, tolerance)) << where;
      EXPECT_TRUE(all_close(fwd.weights, expected.weights, tolerance)) << where;
      ++cases;
    }
  EXPECT_EQ(cases, test::sweep_pairs_run(sweep_shapes.size(), mask_kinds.size()));
  if (!test::sanitized) {
    EXPECT_EQ(cases, static_cast<int>(sweep_shapes.size() * mask_kinds.size()));
  }
}

TYPED_TEST(AttentionTest, WeightRowsSumToOneAndMaskedWeightsAreExactlyZero) {
  using T = TypeParam;
  Random random(7);
  const Shape s{2, 4, 2, 9, 12, 16, 16};
  const auto q = random.normal_tensor<T, 4>({s.batch, s.heads, s.q_len, s.head_dim});
  const auto k = random.normal_tensor<T, 4>({s.batch, s.kv_heads, s.k_len, s.head_dim});
  MaskedOptions<T> m;
  make_options(MaskKind::everything, s, random, m);
  m.opts.key_lengths = {12, 7};
  const auto p = attention_weights(q, k, m.opts);
  int empty_rows = 0;
  for (Index b = 0; b < s.batch; ++b)
    for (Index h = 0; h < s.heads; ++h)
      for (Index i = 0; i < s.q_len; ++i) {
        double sum = 0;
        bool any_allowed = false;
        for (Index j = 0; j < s.k_len; ++j) {
          const bool allowed = test::brute_force_allowed(m.opts, b, h, i, j, s.q_len, s.k_len);
          any_allowed = any_allowed || allowed;
          if (!allowed) {
            EXPECT_EQ(p(b, h, i, j), T(0)) << "masked weight at " << b << h << i << j;
          }
          EXPECT_GE(p(b, h, i, j), T(0));
          sum += static_cast<double>(p(b, h, i, j));
        }
        if (any_allowed) {
          EXPECT_NEAR(sum, 1.0, 10 * default_tolerance<T>());
        } else {
          ++empty_rows;
          EXPECT_EQ(sum, 0.0);
        }
      }
  EXPECT_GT(empty_rows, 0) << "the case should contain fully masked rows";
}

TYPED_TEST(AttentionTest, FullyMaskedRowsGiveZeroOutputAndMinusInfinityLse) {
  using T = TypeParam;
  Random random(11);
  const auto q = random.normal_tensor<T, 4>({2, 2, 6, 8});
  const auto k = random.normal_tensor<T, 4>({2, 2, 4, 8});
  const auto v = random.normal_tensor<T, 4>({2, 2, 4, 5});
  AttentionOptions<T> opts;
  opts.causal = Causal::bottom_right;  // Lq > Lk: rows i < Lq - Lk see no key at all
  opts.key_lengths = {4, 0};           // batch 1 has no valid key
  opts.need_weights = true;
  const auto fwd = sdpa_forward(q, k, v, opts);
  EXPECT_FALSE(test::has_nan(fwd.out));
  EXPECT_FALSE(test::has_nan(fwd.lse));
  for (Index h = 0; h < 2; ++h)
    for (Index i = 0; i < 6; ++i) {
      const bool batch0_empty = i < 2;
      for (Index b = 0; b < 2; ++b) {
        const bool empty = b == 1 || batch0_empty;
        if (!empty) {
          EXPECT_TRUE(std::isfinite(fwd.lse(b, h, i)));
          continue;
        }
        EXPECT_EQ(fwd.lse(b, h, i), -std::numeric_limits<T>::infinity());
        for (Index d = 0; d < 5; ++d) EXPECT_EQ(fwd.out(b, h, i, d), T(0));
        for (Index j = 0; j < 4; ++j) EXPECT_EQ(fwd.weights(b, h, i, j), T(0));
      }
    }
}

TYPED_TEST(AttentionTest, MinusInfinityBiasActsAsAMask) {
  using T = TypeParam;
  Random random(12);
  const auto q = random.normal_tensor<T, 4>({1, 1, 3, 4});
  const auto k = random.normal_tensor<T, 4>({1, 1, 5, 4});
  const auto v = random.normal_tensor<T, 4>({1, 1, 5, 4});
  Tensor<T, 4> bias({1, 1, 3, 5});
  Tensor<bool, 4> allowed({1, 1, 3, 5});
  for (Index j = 0; j < 5; ++j) {
    bias(0, 0, 0, j) = -std::numeric_limits<T>::infinity();  // row 0: everything -inf
    bias(0, 0, 1, j) = j % 2 ? -std::numeric_limits<T>::infinity() : T(0);
    allowed(0, 0, 1, j) = j % 2 == 0;
    allowed(0, 0, 2, j) = true;
  }
  AttentionOptions<T> with_bias, with_mask;
  with_bias.bias = bias;
  with_mask.allowed = allowed;
  const auto a = sdpa_forward(q, k, v, with_bias), b = sdpa_forward(q, k, v, with_mask);
  EXPECT_FALSE(test::has_nan(a.out));
  EXPECT_TRUE(all_close(a.out, b.out, 0.0));
  EXPECT_TRUE(all_close(a.lse, b.lse, 0.0));
  EXPECT_EQ(a.lse(0, 0, 0), -std::numeric_limits<T>::infinity());
}

TYPED_TEST(AttentionTest, NanInMaskedKeysAndValuesDoesNotReachTheOutput) {
  using T = TypeParam;
  Random random(13);
  const auto q = random.normal_tensor<T, 4>({2, 2, 5, 8});
  auto k = random.normal_tensor<T, 4>({2, 2, 7, 8});
  auto v = random.normal_tensor<T, 4>({2, 2, 7, 6});
  Tensor<bool, 4> allowed({1, 1, 1, 7});
  for (Index j = 0; j < 7; ++j) allowed(0, 0, 0, j) = j != 2;
  AttentionOptions<T> opts;
  opts.key_lengths = {5, 7};
  opts.allowed = allowed;
  const auto clean = sdpa_forward(q, k, v, opts);
  const T nan = std::numeric_limits<T>::quiet_NaN();
  for (Index h = 0; h < 2; ++h)
    for (Index d = 0; d < 8; ++d) {
      k(0, h, 5, d) = nan;  // padding of batch 0
      k(0, h, 6, d) = nan;
      k(1, h, 2, d) = nan;  // masked by `allowed`
    }
  for (Index h = 0; h < 2; ++h)
    for (Index d = 0; d < 6; ++d) {
      v(0, h, 6, d) = nan;
      v(1, h, 2, d) = nan;
    }
  const auto planted = sdpa_forward(q, k, v, opts);
  EXPECT_FALSE(test::has_nan(planted.out));
  EXPECT_TRUE(all_close(planted.out, clean.out, 0.0));
  EXPECT_TRUE(all_close(planted.lse, clean.lse, 0.0));
}

// q, k, v as strided views into (B, L, H, D)-ordered buffers equal their contiguous copies.
TYPED_TEST(AttentionTest, StridedViewsEqualContiguousCopies) {
  using T = TypeParam;
  Random random(14);
  const Index B = 2, H = 4, Hkv = 2, L = 9, D = 8;
  auto q_buffer = random.normal_tensor<T, 4>({B, L, H, D});
  auto kv_buffer = random.normal_tensor<T, 4>({B, L, 2 * Hkv, D});  // k heads then v heads, interleaved per row
  const TensorView<const T, 4> q = TensorView<const T, 4>(q_buffer).permute({0, 2, 1, 3});
  const TensorView<const T, 4> k(kv_buffer.data(), {B, Hkv, L, D}, {L * 2 * Hkv * D, D, 2 * Hkv * D, 1});
  const TensorView<const T, 4> v(kv_buffer.data() + Hkv * D, {B, Hkv, L, D}, {L * 2 * Hkv * D, D, 2 * Hkv * D, 1});
  AttentionOptions<T> opts;
  opts.causal = Causal::top_left;
  opts.need_weights = true;
  const auto strided = sdpa_forward(q, k, v, opts);
  const auto contiguous = sdpa_forward(Tensor<T, 4>(q), Tensor<T, 4>(k), Tensor<T, 4>(v), opts);
  EXPECT_TRUE(all_close(strided.out, contiguous.out, 0.0));
  EXPECT_TRUE(all_close(strided.weights, contiguous.weights, 0.0));
}

// Query head h reads key/value head h / (H / Hkv) in every kernel: each is run by name (the default would choose
// the decode kernel for L = 7), with and without a causal mask, against the same call on key/value heads repeated
// H / Hkv times (where every head mapping agrees) and against the brute force, whose mapping is written out. With
// H = 6 and Hkv = 2 a wrong mapping (h % Hkv, say) reads another head's keys for some h and fails both.
TYPED_TEST(AttentionTest, GroupedQueryEqualsRepeatedKeyValueHeads) {
  using T = TypeParam;
  Random random(15);
  const Index B = 2, H = 6, Hkv = 2, D = 5;
  for (const Index L : {7, 33}) {
    const auto q = random.normal_tensor<T, 4>({B, H, L, D});
    const auto k = random.normal_tensor<T, 4>({B, Hkv, L, D});
    const auto v = random.normal_tensor<T, 4>({B, Hkv, L, D});
    const Tensor<T, 4> k_repeated = test::repeat_kv_heads(k, H), v_repeated = test::repeat_kv_heads(v, H);
    for (const Causal causal : {Causal::none, Causal::top_left})
      for (const Kernel kernel : {Kernel::reference, Kernel::fused, Kernel::decode}) {
        SCOPED_TRACE("L = " + std::to_string(L) + ", causal " + std::to_string(static_cast<int>(causal)) +
                     ", kernel " + std::to_string(static_cast<int>(kernel)));
        AttentionOptions<T> opts;
        opts.causal = causal;
        opts.kernel = kernel;
        const auto grouped = scaled_dot_product_attention(q, k, v, opts);
        EXPECT_TRUE(all_close(grouped, scaled_dot_product_attention(q, k_repeated, v_repeated, opts),
                              default_tolerance<T>()));
        EXPECT_TRUE(all_close(grouped, test::brute_force_attention<T>(q, k, v, opts).out, default_tolerance<T>()));
      }
  }
}

TYPED_TEST(AttentionTest, OutputOnlyAndWeightsOnlyEntriesAgreeWithSdpaForward) {
  using T = TypeParam;
  Random random(16);
  const auto q = random.normal_tensor<T, 4>({1, 2, 4, 3});
  const auto k = random.normal_tensor<T, 4>({1, 2, 6, 3});
  const auto v = random.normal_tensor<T, 4>({1, 2, 6, 2});
  AttentionOptions<T> opts;
  opts.causal = Causal::bottom_right;
  opts.need_weights = true;
  const auto fwd = sdpa_forward(q, k, v, opts);
  EXPECT_TRUE(all_close(scaled_dot_product_attention(q, k, v, opts), fwd.out, 0.0));
  EXPECT_TRUE(all_close(attention_weights(q, k, opts), fwd.weights, 0.0));
  opts.need_weights = false;
  EXPECT_EQ(sdpa_forward(q, k, v, opts).weights.size(), 0);
}

TYPED_TEST(AttentionTest, CausalAlignmentsAgreeWhenLengthsAreEqual) {
  using T = TypeParam;
  Random random(17);
  const auto q = random.normal_tensor<T, 4>({1, 2, 6, 4});
  const auto k = random.normal_tensor<T, 4>({1, 2, 6, 4});
  const auto v = random.normal_tensor<T, 4>({1, 2, 6, 4});
  AttentionOptions<T> top_left, bottom_right;
  top_left.causal = Causal::top_left;
  bottom_right.causal = Causal::bottom_right;
  EXPECT_TRUE(all_close(scaled_dot_product_attention(q, k, v, top_left),
                        scaled_dot_product_attention(q, k, v, bottom_right), 0.0));
}

// Under a causal mask, row i ignores every token after i: changing keys and values j > i leaves it alone.
TYPED_TEST(AttentionTest, CausalRowIgnoresLaterTokens) {
  using T = TypeParam;
  Random random(18);
  const Index L = 8;
  const auto q = random.normal_tensor<T, 4>({1, 1, L, 4});
  auto k = random.normal_tensor<T, 4>({1, 1, L, 4});
  auto v = random.normal_tensor<T, 4>({1, 1, L, 4});
  AttentionOptions<T> opts;
  opts.causal = Causal::top_left;
  const auto before = scaled_dot_product_attention(q, k, v, opts);
  const Index i = 3;
  for (Index j = i + 1; j < L; ++j)
    for (Index d = 0; d < 4; ++d) {
      k(0, 0, j, d) += T(5);
      v(0, 0, j, d) -= T(7);
    }
  const auto after = scaled_dot_product_attention(q, k, v, opts);
  for (Index row = 0; row <= i; ++row)
    for (Index d = 0; d < 4; ++d) EXPECT_EQ(after(0, 0, row, d), before(0, 0, row, d)) << "row " << row;
  EXPECT_NE(after(0, 0, L - 1, 0), before(0, 0, L - 1, 0)) << "later rows do see the change";
}

TYPED_TEST(AttentionTest, RepeatedCallsAreBitwiseEqual) {
  using T = TypeParam;
  Random random(19);
  const auto q = random.normal_tensor<T, 4>({2, 4, 33, 16});
  const auto k = random.normal_tensor<T, 4>({2, 2, 47, 16});
  const auto v = random.normal_tensor<T, 4>({2, 2, 47, 8});
  AttentionOptions<T> opts;
  opts.causal = Causal::bottom_right;
  opts.dropout_p = T(0.25);
  opts.seed = 5;
  const auto a = sdpa_forward(q, k, v, opts), b = sdpa_forward(q, k, v, opts);
  EXPECT_TRUE(all_close(a.out, b.out, 0.0));
  EXPECT_TRUE(all_close(a.lse, b.lse, 0.0));
}

// Dropout: out = sum_j P_ij * keep_ij / (1 - p) * v_j with the keep decision of the (seed, b, h, i, j)
// stream; weights and lse are taken before dropout.
TYPED_TEST(AttentionTest, DropoutScalesKeptProbabilities) {
  using T = TypeParam;
  Random random(20);
  const auto q = random.normal_tensor<T, 4>({2, 2, 6, 4});
  const auto k = random.normal_tensor<T, 4>({2, 2, 9, 4});
  const auto v = random.normal_tensor<T, 4>({2, 2, 9, 3});
  AttentionOptions<T> opts;
  opts.need_weights = true;
  const auto plain = sdpa_forward(q, k, v, opts);
  opts.dropout_p = T(0.3);
  opts.seed = 99;
  const auto dropped = sdpa_forward(q, k, v, opts);
  EXPECT_TRUE(all_close(dropped.weights, plain.weights, 0.0));
  EXPECT_TRUE(all_close(dropped.lse, plain.lse, 0.0));
  Tensor<T, 4> expected({2, 2, 6, 3});
  int dropped_count = 0;
  for (Index b = 0; b < 2; ++b)
    for (Index h = 0; h < 2; ++h)
      for (Index i = 0; i < 6; ++i)
        for (Index j = 0; j < 9; ++j) {
          const bool keep = detail::dropout_uniform(99, b, h, i, j) >= 0.3;
          dropped_count += !keep;
          for (Index d = 0; d < 3; ++d)
            if (keep) expected(b, h, i, d) += plain.weights(b, h, i, j) / T(0.7) * v(b, h, j, d);
        }
  EXPECT_GT(dropped_count, 0);
  EXPECT_TRUE(all_close(dropped.out, expected, 10 * default_tolerance<T>()));
  opts.seed = 100;
  EXPECT_FALSE(all_close(sdpa_forward(q, k, v, opts).out, dropped.out, 1e-3)) << "another seed, another mask";
}

TYPED_TEST(AttentionTest, EmptyExtentsGiveEmptyOrZeroResults) {
  using T = TypeParam;
  const Tensor<T, 4> q({2, 2, 0, 4}), k({2, 2, 5, 4}), v({2, 2, 5, 3});
  EXPECT_EQ(sdpa_forward(q, k, v).out.size(), 0);
  const Tensor<T, 4> q1({1, 1, 2, 4}), k0({1, 1, 0, 4}), v0({1, 1, 0, 3});
  const auto fwd = sdpa_forward(q1, k0, v0);  // Lk = 0: every row is fully masked
  EXPECT_EQ(fwd.out(0, 0, 1, 2), T(0));
  EXPECT_EQ(fwd.lse(0, 0, 0), -std::numeric_limits<T>::infinity());
}

// ---- validation ------------------------------------------------------------------------------------

TYPED_TEST(AttentionTest, BadShapesThrowShapeErrorNamingTheArgument) {
  using T = TypeParam;
  const Tensor<T, 4> q({2, 4, 5, 8}), k({2, 2, 6, 8}), v({2, 2, 6, 3});
  expect_error<ShapeError>([&] { sdpa_forward(q, Tensor<T, 4>({2, 2, 6, 7}), v); },
                           {"[sdpa_forward]", "k:", "(2, *, *, 8)", "(2, 2, 6, 7)"});
  expect_error<ShapeError>([&] { sdpa_forward(q, Tensor<T, 4>({3, 2, 6, 8}), v); }, {"k:", "(3, 2, 6, 8)"});
  expect_error<ShapeError>([&] { sdpa_forward(q, Tensor<T, 4>({2, 3, 6, 8}), Tensor<T, 4>({2, 3, 6, 3})); },
                           {"k:", "divide", "4 query heads", "(2, 3, 6, 8)"});
  expect_error<ShapeError>([&] { sdpa_forward(q, k, Tensor<T, 4>({2, 2, 5, 3})); }, {"v:", "(2, 2, 6, *)", "(2, 2, 5, 3)"});
  expect_error<ShapeError>([&] { sdpa_forward(Tensor<T, 4>({2, 4, 5, 0}), Tensor<T, 4>({2, 2, 6, 0}), v); },
                           {"q:", "head dim"});
  expect_error<ShapeError>([&] { attention_weights(q, Tensor<T, 4>({2, 0, 6, 8})); }, {"[attention_weights]", "k:"});
  expect_error<ShapeError>([&] { scaled_dot_product_attention(q, k, Tensor<T, 4>({1, 2, 6, 3})); },
                           {"[scaled_dot_product_attention]", "v:"});
}

TYPED_TEST(AttentionTest, BadOptionsThrowNamingTheOption) {
  using T = TypeParam;
  const Tensor<T, 4> q({2, 4, 5, 8}), k({2, 2, 6, 8}), v({2, 2, 6, 3});
  const auto with = [&](auto change) {
    return [&q, &k, &v, change] {
      AttentionOptions<T> opts;
      change(opts);
      sdpa_forward(q, k, v, opts);
    };
  };
  expect_error<ShapeError>(with([](auto& o) { o.key_lengths = {3}; }), {"opts.key_lengths", "expected 2", "got 1"});
  expect_error<std::invalid_argument>(with([](auto& o) { o.key_lengths = {3, 7}; }), {"opts.key_lengths[1]", "[0, 6]", "7"});
  expect_error<std::invalid_argument>(with([](auto& o) { o.key_lengths = {-1, 2}; }), {"opts.key_lengths[0]"});
  const Tensor<bool, 4> bad_mask({2, 4, 5, 5});
  expect_error<ShapeError>(with([&](auto& o) { o.allowed = bad_mask; }),
                           {"opts.allowed", "broadcastable to (2, 4, 5, 6)", "(2, 4, 5, 5)"});
  const Tensor<T, 4> bad_bias({1, 2, 1, 6});
  expect_error<ShapeError>(with([&](auto& o) { o.bias = bad_bias; }), {"opts.bias", "(1, 2, 1, 6)"});
  expect_error<std::invalid_argument>(with([](auto& o) { o.window_left = -2; }), {"opts.window_left", "-2"});
  expect_error<std::invalid_argument>(with([](auto& o) { o.window_right = -5; }), {"opts.window_right", "-5"});
  expect_error<ShapeError>(with([](auto& o) { o.alibi_slopes = {T(1), T(2)}; }), {"opts.alibi_slopes", "expected 4", "got 2"});
  expect_error<std::invalid_argument>(with([](auto& o) { o.alibi_slopes.assign(4, std::numeric_limits<T>::infinity()); }),
                                      {"opts.alibi_slopes", "finite"});
  expect_error<std::invalid_argument>(with([](auto& o) { o.scale = std::numeric_limits<T>::quiet_NaN(); }), {"opts.scale"});
  expect_error<std::invalid_argument>(with([](auto& o) { o.dropout_p = T(1); }), {"opts.dropout_p", "[0, 1)"});
  expect_error<std::invalid_argument>(with([](auto& o) { o.dropout_p = T(-0.1); }), {"opts.dropout_p"});
  expect_error<std::invalid_argument>(with([](auto& o) { o.dropout_p = std::numeric_limits<T>::quiet_NaN(); }),
                                      {"opts.dropout_p"});
}

}  // namespace
}  // namespace selfattn::test
