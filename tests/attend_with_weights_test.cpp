// tests/attend_with_weights_test.cpp — attend_with_weights (out = P V per head, P given): with the weights that
// sdpa_forward computes it gives sdpa_forward's out, over random shapes with grouped-query heads and every kind of
// mask; MultiHeadAttention::forward recomposed from public pieces (linear, split_heads, attend_with_weights,
// merge_heads) equals the module's output; weights are used as given (not normalised); strided views; empty
// extents; shape errors name `v`.
#include <selfattn/attend_with_weights.hpp>
#include <selfattn/attention.hpp>
#include <selfattn/heads.hpp>
#include <selfattn/nn/multihead.hpp>
#include <selfattn/projection.hpp>

#include "support/compare.hpp"
#include "support/expect_error.hpp"
#include "support/module_config.hpp"
#include "support/random.hpp"
#include "support/scalars.hpp"

#include <gtest/gtest.h>

#include <array>
#include <string>

namespace selfattn::test {
namespace {

SELFATTN_SCALAR_TEST_SUITE(AttendWithWeightsTest);

template <typename T>
double tolerance() {
  return std::is_same_v<T, double> ? 1e-12 : 2e-6;
}

// out(b, h, i, d) = sum_j weights(b, h, i, j) v(b, h / group, j, d), one element at a time.
template <typename T>
Tensor<T, 4> attend_by_hand(const Tensor<T, 4>& weights, const Tensor<T, 4>& v) {
  Tensor<T, 4> out({weights.dim(0), weights.dim(1), weights.dim(2), v.dim(3)});
  const Index group = weights.dim(1) / v.dim(1);
  for (Index b = 0; b < weights.dim(0); ++b)
    for (Index h = 0; h < weights.dim(1); ++h)
      for (Index i = 0; i < weights.dim(2); ++i)
        for (Index d = 0; d < v.dim(3); ++d) {
          double sum = 0;
          for (Index j = 0; j < weights.dim(3); ++j)
            sum += static_cast<double>(weights(b, h, i, j)) * static_cast<double>(v(b, h / group, j, d));
          out(b, h, i, d) = static_cast<T>(sum);
        }
  return out;
}

// 40 random cases: B 1-3, Hkv 1-3 with 1-3 query heads each, Lq and Lk 0-9, D 1-8, Dv 1-7, each with one mask
// (none, causal top-left or bottom-right, key lengths, a boolean mask, a sliding window, an additive bias). The
// weights sdpa_forward returns, attended to v, give its out.
TYPED_TEST(AttendWithWeightsTest, WithSdpaWeightsGivesSdpaOutput) {
  using T = TypeParam;
  Random random(12);
  for (int c = 0; c < 40; ++c) {
    const Index batch = random.integer(1, 3), kv_heads = random.integer(1, 3), heads = kv_heads * random.integer(1, 3);
    const Index lq = random.integer(0, 9), lk = random.integer(0, 9), d = random.integer(1, 8),
                dv = random.integer(1, 7);
    const Tensor<T, 4> q = random.normal_tensor<T, 4>({batch, heads, lq, d});
    const Tensor<T, 4> k = random.normal_tensor<T, 4>({batch, kv_heads, lk, d});
    const Tensor<T, 4> v = random.normal_tensor<T, 4>({batch, kv_heads, lk, dv});
    AttentionOptions<T> opts;
    opts.need_weights = true;
    const Tensor<bool, 4> allowed = random.bool_tensor<4>({batch, 1, lq, lk}, 0.7);
    const Tensor<T, 4> bias = random.normal_tensor<T, 4>({1, heads, lq, lk});
    const int mask = c % 7;
    if (mask == 1) opts.causal = Causal::top_left;
    if (mask == 2) opts.causal = Causal::bottom_right;
    if (mask == 3)
      for (Index b = 0; b < batch; ++b) opts.key_lengths.push_back(random.integer(0, lk));
    if (mask == 4) opts.allowed = allowed.view();
    if (mask == 5) opts.window_left = opts.window_right = 2;
    if (mask == 6) opts.bias = bias.view();
    const AttentionForward<T> fwd = sdpa_forward(q, k, v, opts);
    const Tensor<T, 4> out = attend_with_weights(fwd.weights, v);
    EXPECT_TRUE(all_close(out, fwd.out, tolerance<T>()))
        << "case " << c << ": B " << batch << ", H " << heads << ", Hkv " << kv_heads << ", Lq " << lq << ", Lk " << lk
        << ", mask " << mask;
    EXPECT_TRUE(all_close(attend_with_weights(attention_weights(q, k, opts), v), fwd.out, tolerance<T>()))
        << "case " << c << " through attention_weights";
  }
}

// The module is linear after its softmax: out_proj(merge_heads(P split_heads(v_proj(value)))) is its output.
// Self- and cross-attention, grouped-query heads, no biases, RoPE and ALiBi (which change P only), key lengths.
TYPED_TEST(AttendWithWeightsTest, ModuleRecomposedFromPublicPiecesEqualsForward) {
  using T = TypeParam;
  struct Case {
    Index embed, heads, kv_heads, lq, lk, kdim, vdim;
    bool bias, rope, alibi, cross, key_lengths;
  };
  const Case cases[] = {
      {16, 4, 4, 7, 7, 0, 0, true, false, false, false, false},  // self-attention
      {16, 4, 2, 6, 6, 0, 0, true, true, false, false, true},    // GQA, RoPE, padding
      {12, 3, 1, 5, 8, 10, 6, false, false, true, true, false},  // cross-attention, MQA, no biases, ALiBi
      {8, 2, 2, 1, 9, 0, 0, true, false, false, true, true},     // one query row over nine keys
  };
  Random random(7);
  for (const Case& c : cases) {
    MultiHeadAttention<T> mha(ModuleConfig(c.embed, c.heads)
                                  .kv_heads(c.kv_heads)
                                  .input_dims(c.kdim, c.vdim)
                                  .with_bias(c.bias)
                                  .rope(c.rope ? c.embed / c.heads : 0)
                                  .with_alibi(c.alibi),
                              3);
    const MhaParams<T>& p = mha.params();
    const Index batch = 2;
    const Tensor<T, 3> query = random.normal_tensor<T, 3>({batch, c.lq, c.embed});
    const Tensor<T, 3> key = random.normal_tensor<T, 3>({batch, c.lk, c.kdim ? c.kdim : c.embed});
    const Tensor<T, 3> value = random.normal_tensor<T, 3>({batch, c.lk, c.vdim ? c.vdim : c.embed});
    AttentionOptions<T> opts;
    opts.need_weights = true;
    if (c.key_lengths) opts.key_lengths = {c.lk, c.lk - 2};
    const MhaForward<T> fwd = c.cross ? mha.forward(query, key, value, opts) : mha.forward(query, opts);
    const Tensor<T, 3>& source = c.cross ? value : query;
    const Tensor<T, 3> projected = linear<T>(source, p.v_weight, p.v_bias);                      // (B, Lk, Hkv Dh)
    const Tensor<T, 4> heads_out =
        attend_with_weights(fwd.weights, split_heads(projected, c.kv_heads));                    // (B, H, Lq, Dh)
    const Tensor<T, 3> merged = merge_heads(heads_out);                                          // (B, Lq, E)
    const Tensor<T, 3> output = linear<T>(merged, p.out_weight, p.out_bias);
    EXPECT_TRUE(all_close(output, fwd.output, 10 * tolerance<T>()))
        << "E " << c.embed << ", H " << c.heads << ", Hkv " << c.kv_heads << ", Lq " << c.lq << ", Lk " << c.lk;
  }
}

// Any weights, not only probabilities: negative entries, rows that do not sum to 1, on strided views (v as a
// split_heads view of a (B, Lk, Hkv Dv) tensor, the weights as every other query row of a larger tensor).
TYPED_TEST(AttendWithWeightsTest, UsesTheWeightsAsGivenOnStridedViews) {
  using T = TypeParam;
  Random random(3);
  Tensor<T, 3> values = random.normal_tensor<T, 3>({2, 6, 2 * 5});  // (B, Lk, Hkv Dv), Hkv = 2, Dv = 5
  const TensorView<T, 4> v = split_heads(values, 2);                 // (2, 2, 6, 5), strides (60, 5, 10, 1)
  Tensor<T, 4> larger = random.normal_tensor<T, 4>({2, 4, 8, 6});
  const std::array<Index, 4> strides = larger.strides();  // (192, 48, 6, 1)
  const TensorView<T, 4> weights(larger.data(), {2, 4, 4, 6}, {strides[0], strides[1], 2 * strides[2], 1});
  const Tensor<T, 4> out = attend_with_weights(weights, v);
  EXPECT_EQ(out.shape(), (std::array<Index, 4>{2, 4, 4, 5}));
  EXPECT_TRUE(all_close(
      out, attend_by_hand(Tensor<T, 4>(TensorView<const T, 4>(weights)), Tensor<T, 4>(TensorView<const T, 4>(v))),
      tolerance<T>()));
}

TYPED_TEST(AttendWithWeightsTest, EmptyExtents) {
  using T = TypeParam;
  Random random(5);
  // No keys: every output row is an empty sum, 0.
  const Tensor<T, 4> none = attend_with_weights(Tensor<T, 4>({2, 2, 3, 0}), Tensor<T, 4>({2, 1, 0, 4}));
  EXPECT_EQ(none.shape(), (std::array<Index, 4>{2, 2, 3, 4}));
  for (Index n = 0; n < none.size(); ++n) EXPECT_EQ(none.data()[n], T(0));
  EXPECT_EQ(attend_with_weights(Tensor<T, 4>({2, 2, 0, 5}), random.normal_tensor<T, 4>({2, 2, 5, 3})).shape(),
            (std::array<Index, 4>{2, 2, 0, 3}));
  EXPECT_EQ(attend_with_weights(Tensor<T, 4>({0, 2, 3, 5}), Tensor<T, 4>({0, 2, 5, 3})).shape(),
            (std::array<Index, 4>{0, 2, 3, 3}));
}

TYPED_TEST(AttendWithWeightsTest, ShapeErrorsNameV) {
  using T = TypeParam;
  const Tensor<T, 4> weights({2, 4, 3, 7});
  expect_error<ShapeError>([&] { attend_with_weights(weights, Tensor<T, 4>({1, 2, 7, 5})); },
                           {"[attend_with_weights] v:", "expected shape (2, *, 7, *)", "got (1, 2, 7, 5)"});
  expect_error<ShapeError>([&] { attend_with_weights(weights, Tensor<T, 4>({2, 2, 6, 5})); },
                           {"[attend_with_weights] v:", "expected shape (2, *, 7, *)", "got (2, 2, 6, 5)"});
  expect_error<ShapeError>([&] { attend_with_weights(weights, Tensor<T, 4>({2, 3, 7, 5})); },
                           {"[attend_with_weights] v:", "must divide the 4 heads", "got shape (2, 3, 7, 5)"});
  expect_error<ShapeError>([&] { attend_with_weights(weights, Tensor<T, 4>({2, 0, 7, 5})); },
                           {"[attend_with_weights] v:", "must divide the 4 heads"});
}

}  // namespace
}  // namespace selfattn::test
