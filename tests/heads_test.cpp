// tests/heads_test.cpp — split_heads (a zero-copy view (B, L, H * D) -> (B, H, L, D)) and merge_heads
// (its inverse, a copy), on contiguous, strided and permuted inputs, with errors and empty extents; and
// average_heads (the mean over heads of attention weights, PyTorch's average_attn_weights=True).
#include <selfattn/heads.hpp>

#include "support/compare.hpp"
#include "support/expect_error.hpp"
#include "support/random.hpp"
#include "support/scalars.hpp"

#include <gtest/gtest.h>

#include <array>
#include <string>
#include <type_traits>

namespace selfattn::test {
namespace {

SELFATTN_SCALAR_TEST_SUITE(HeadsTest);

// Expects h(b, i, l, d) == x(b, l, i * D + d) for every element.
template <typename H, typename X>
void expect_heads_of(const H& h, const X& x) {
  const Index heads = h.dim(1), head_dim = h.dim(3);
  ASSERT_EQ(h.dim(0), x.dim(0));
  ASSERT_EQ(h.dim(2), x.dim(1));
  ASSERT_EQ(heads * head_dim, x.dim(2));
  for (Index b = 0; b < h.dim(0); ++b)
    for (Index i = 0; i < heads; ++i)
      for (Index l = 0; l < h.dim(2); ++l)
        for (Index d = 0; d < head_dim; ++d)
          ASSERT_EQ(h(b, i, l, d), x(b, l, i * head_dim + d)) << "at (" << b << ", " << i << ", " << l << ", " << d << ")";
}

TYPED_TEST(HeadsTest, SplitIsAZeroCopyView) {
  using T = TypeParam;
  Random random(1);
  Tensor<T, 3> x = random.normal_tensor<T, 3>({2, 5, 12});
  const TensorView<T, 4> h = split_heads(x, 3);
  EXPECT_EQ(h.shape(), (std::array<Index, 4>{2, 3, 5, 4}));
  EXPECT_EQ(h.data(), x.data());
  // (s0, D, s1, 1) for x's strides (60, 12, 1).
  EXPECT_EQ(h.strides(), (std::array<Index, 4>{60, 4, 12, 1}));
  expect_heads_of(h, x);

  // Writes through the view land in x at (b, l, h * D + d).
  h(1, 2, 3, 1) = T(42);
  EXPECT_EQ(x(1, 3, 2 * 4 + 1), T(42));
  h(0, 0, 4, 3) = T(-7);
  EXPECT_EQ(x(0, 4, 3), T(-7));
  as_matrix(h[1][1]).setZero();  // head 1 of batch 1: columns 4..7 of x[1]
  for (Index l = 0; l < 5; ++l) {
    for (Index c = 4; c < 8; ++c) EXPECT_EQ(x(1, l, c), T(0));
    EXPECT_NE(x(1, l, 3), T(0));
    EXPECT_NE(x(1, l, 8), T(0));
  }
}

TYPED_TEST(HeadsTest, SplitOfConstIsConst) {
  using T = TypeParam;
  Random random(2);
  const Tensor<T, 3> x = random.normal_tensor<T, 3>({1, 3, 6});
  const auto h = split_heads(x, 2);
  static_assert(std::is_same_v<std::decay_t<decltype(h)>, TensorView<const T, 4>>, "a const tensor splits to const heads");
  EXPECT_EQ(h.data(), x.data());
  expect_heads_of(h, x);
  const TensorView<const T, 3> cv = x;
  const TensorView<const T, 4> hv = split_heads(cv, 6);  // one element per head
  EXPECT_EQ(hv.shape(), (std::array<Index, 4>{1, 6, 3, 1}));
  expect_heads_of(hv, x);
}

TYPED_TEST(HeadsTest, SplitOfAColumnBlockOfAWiderBuffer) {
  using T = TypeParam;
  // A fused (B, L, 3E) Q|K|V buffer, as the module produces; k is columns E..2E.
  constexpr Index B = 2, L = 7, E = 10, H = 5, D = E / H;
  Random random(3);
  Tensor<T, 3> qkv = random.normal_tensor<T, 3>({B, L, 3 * E});
  const TensorView<T, 3> k(qkv.data() + E, {B, L, E}, {L * 3 * E, 3 * E, 1});
  const TensorView<T, 4> h = split_heads(k, H);
  EXPECT_EQ(h.shape(), (std::array<Index, 4>{B, H, L, D}));
  EXPECT_EQ(h.strides(), (std::array<Index, 4>{L * 3 * E, D, 3 * E, 1}));
  EXPECT_EQ(h.data(), qkv.data() + E);
  for (Index b = 0; b < B; ++b)
    for (Index i = 0; i < H; ++i)
      for (Index l = 0; l < L; ++l)
        for (Index d = 0; d < D; ++d) ASSERT_EQ(h(b, i, l, d), qkv(b, l, E + i * D + d));
  h(1, 4, 6, 1) = T(9);
  EXPECT_EQ(qkv(1, 6, E + 4 * D + 1), T(9));

  // A batch stride that is not L times the row stride (rows padded per batch) works too.
  Tensor<T, 3> padded = random.normal_tensor<T, 3>({B, L + 3, E + 2});
  const TensorView<const T, 3> inner(padded.data() + 1, {B, L, E}, {(L + 3) * (E + 2), E + 2, 1});
  const TensorView<const T, 4> hp = split_heads(inner, 2);
  expect_heads_of(hp, inner);
}

TYPED_TEST(HeadsTest, MergeInvertsSplitExactly) {
  using T = TypeParam;
  Random random(4);
  for (const auto& shape : {std::array<Index, 4>{2, 3, 5, 4}, std::array<Index, 4>{1, 1, 1, 1},
                            std::array<Index, 4>{3, 7, 2, 3}, std::array<Index, 4>{1, 4, 9, 1}}) {
    SCOPED_TRACE(detail::shape_string<4>(shape));
    const Index B = shape[0], H = shape[1], L = shape[2], D = shape[3];
    const Tensor<T, 3> x = random.normal_tensor<T, 3>({B, L, H * D});
    const Tensor<T, 3> round_trip = merge_heads(split_heads(x, H));
    EXPECT_NE(round_trip.data(), x.data());  // a new tensor
    EXPECT_TRUE(all_close(round_trip, x, 0.0));

    // And split_heads(merge_heads(h)) == h for contiguous heads.
    const Tensor<T, 4> heads = random.normal_tensor<T, 4>(shape);
    Tensor<T, 3> merged = merge_heads(heads);
    EXPECT_EQ(merged.shape(), (std::array<Index, 3>{B, L, H * D}));
    expect_heads_of(heads, merged);
    EXPECT_TRUE(all_close(split_heads(merged, H), heads, 0.0));
  }
}

TYPED_TEST(HeadsTest, MergeOfAPermutedView) {
  using T = TypeParam;
  constexpr Index B = 2, L = 5, H = 3, D = 4;
  Random random(5);
  // (B, L, H, D) laid out like x itself: permuting to (B, H, L, D) and merging gives x back.
  Tensor<T, 4> blhd = random.normal_tensor<T, 4>({B, L, H, D});
  const TensorView<T, 4> bhld = blhd.view().permute({0, 2, 1, 3});
  ASSERT_FALSE(bhld.is_contiguous());
  const Tensor<T, 3> merged = merge_heads(bhld);
  EXPECT_EQ(merged.shape(), (std::array<Index, 3>{B, L, H * D}));
  const TensorView<const T, 3> expected(blhd.data(), {B, L, H * D});
  EXPECT_TRUE(all_close(merged, expected, 0.0));

  // A const view works the same.
  const TensorView<const T, 4> cbhld = bhld;
  EXPECT_TRUE(all_close(merge_heads(cbhld), expected, 0.0));

  // A (H, B, L, D) buffer permuted to (B, H, L, D).
  Tensor<T, 4> hbld = random.normal_tensor<T, 4>({H, B, L, D});
  const Tensor<T, 3> m2 = merge_heads(hbld.view().permute({1, 0, 2, 3}));
  for (Index b = 0; b < B; ++b)
    for (Index l = 0; l < L; ++l)
      for (Index i = 0; i < H; ++i)
        for (Index d = 0; d < D; ++d) ASSERT_EQ(m2(b, l, i * D + d), hbld(i, b, l, d));
}

TYPED_TEST(HeadsTest, MergeOfAStridedView) {
  using T = TypeParam;
  constexpr Index B = 3, L = 4, E = 6, H = 2;
  Random random(6);
  const Tensor<T, 3> qkv = random.normal_tensor<T, 3>({B, L, 3 * E});
  // v = columns 2E..3E of the fused buffer, split into heads (a strided 4-D view), then merged.
  const TensorView<const T, 3> v(qkv.data() + 2 * E, {B, L, E}, {L * 3 * E, 3 * E, 1});
  const Tensor<T, 3> merged = merge_heads(split_heads(v, H));
  EXPECT_TRUE(all_close(merged, v, 0.0));
  EXPECT_TRUE(merged.view().is_contiguous());

  // A view that skips every other row of a taller buffer: row stride 2 * (H * D).
  const Tensor<T, 4> tall = random.normal_tensor<T, 4>({B, H, 2 * L, 3});
  const TensorView<const T, 4> every_other(tall.data(), {B, H, L, 3}, {H * 2 * L * 3, 2 * L * 3, 2 * 3, 1});
  const Tensor<T, 3> m = merge_heads(every_other);
  for (Index b = 0; b < B; ++b)
    for (Index i = 0; i < H; ++i)
      for (Index l = 0; l < L; ++l)
        for (Index d = 0; d < 3; ++d) ASSERT_EQ(m(b, l, i * 3 + d), tall(b, i, 2 * l, d));
}

TYPED_TEST(HeadsTest, SplitRejectsBadHeadCounts) {
  using T = TypeParam;
  Tensor<T, 3> x({2, 3, 10});
  const auto expect_shape_error = [&](Index heads) {
    SCOPED_TRACE("heads = " + std::to_string(heads));
    // "[split_heads] x: the last extent must be a multiple of heads = 3, got shape (2, 3, 10)"
    expect_error<ShapeError>([&] { (void)split_heads(x, heads); },
                             {"[split_heads] x:", "heads = " + std::to_string(heads), "(2, 3, 10)"});
  };
  expect_shape_error(3);   // does not divide E = 10
  expect_shape_error(4);
  expect_shape_error(20);  // more heads than columns
  expect_shape_error(0);
  expect_shape_error(-2);
  EXPECT_THROW(split_heads(TensorView<const T, 3>(x), 7), std::invalid_argument);  // ShapeError is one
  EXPECT_NO_THROW(split_heads(x, 5));
  EXPECT_NO_THROW(split_heads(x, 10));
}

TYPED_TEST(HeadsTest, EmptyExtents) {
  using T = TypeParam;
  // B = 0
  Tensor<T, 3> no_batch({0, 4, 6});
  const TensorView<T, 4> h0 = split_heads(no_batch, 3);
  EXPECT_EQ(h0.shape(), (std::array<Index, 4>{0, 3, 4, 2}));
  EXPECT_TRUE(h0.empty());
  const Tensor<T, 3> m0 = merge_heads(h0);
  EXPECT_EQ(m0.shape(), (std::array<Index, 3>{0, 4, 6}));

  // L = 0
  Tensor<T, 3> no_rows({2, 0, 6});
  const TensorView<T, 4> h1 = split_heads(no_rows, 2);
  EXPECT_EQ(h1.shape(), (std::array<Index, 4>{2, 2, 0, 3}));
  const Tensor<T, 3> m1 = merge_heads(h1);
  EXPECT_EQ(m1.shape(), (std::array<Index, 3>{2, 0, 6}));
  EXPECT_TRUE(m1.empty());

  // H = 0 heads to merge
  const Tensor<T, 4> no_heads({2, 0, 3, 4});
  const Tensor<T, 3> m2 = merge_heads(no_heads);
  EXPECT_EQ(m2.shape(), (std::array<Index, 3>{2, 3, 0}));

  // E = 0 splits into heads of size 0
  Tensor<T, 3> no_columns({2, 3, 0});
  const TensorView<T, 4> h3 = split_heads(no_columns, 4);
  EXPECT_EQ(h3.shape(), (std::array<Index, 4>{2, 4, 3, 0}));
  EXPECT_EQ(merge_heads(h3).shape(), (std::array<Index, 3>{2, 3, 0}));
}

// ---- average_heads --------------------------------------------------------------------------------

TYPED_TEST(HeadsTest, AverageHeadsIsTheMeanOverDimensionOne) {
  using T = TypeParam;
  Random random(11);
  const Tensor<T, 4> w = random.uniform_tensor<T, 4>({2, 3, 4, 5}, 0.0, 1.0);
  const Tensor<T, 3> mean = average_heads(w);
  ASSERT_EQ(mean.shape(), (std::array<Index, 3>{2, 4, 5}));
  for (Index b = 0; b < 2; ++b)
    for (Index i = 0; i < 4; ++i)
      for (Index j = 0; j < 5; ++j) {
        const T expected = (w(b, 0, i, j) + w(b, 1, i, j) + w(b, 2, i, j)) / T(3);  // torch: w.mean(dim=1)
        EXPECT_EQ(mean(b, i, j), expected) << "at (" << b << ", " << i << ", " << j << ")";
      }
  // A view gives the same, const or not.
  EXPECT_TRUE(all_close(average_heads(TensorView<const T, 4>(w)), mean, 0.0));
  Tensor<T, 4> copy = w;
  EXPECT_TRUE(all_close(average_heads(copy.view()), mean, 0.0));
}

TYPED_TEST(HeadsTest, AverageHeadsKeepsRowsThatSumToOne) {
  using T = TypeParam;
  // Softmax-like rows per head (each sums to 1) average to rows that sum to 1; a masked column (0 in every
  // head) stays exactly 0.
  Random random(12);
  Tensor<T, 4> w({1, 4, 3, 6});
  for (Index h = 0; h < 4; ++h)
    for (Index i = 0; i < 3; ++i) {
      T total = 0;
      for (Index j = 0; j < 5; ++j) total += (w(0, h, i, j) = static_cast<T>(random.uniform(0.1, 1.0)));
      for (Index j = 0; j < 5; ++j) w(0, h, i, j) /= total;  // column 5 stays 0
    }
  const Tensor<T, 3> mean = average_heads(w);
  for (Index i = 0; i < 3; ++i) {
    T row = 0;
    for (Index j = 0; j < 6; ++j) row += mean(0, i, j);
    EXPECT_NEAR(static_cast<double>(row), 1.0, 1e-6);
    EXPECT_EQ(mean(0, i, 5), T(0));
  }
}

TYPED_TEST(HeadsTest, AverageHeadsOfStridedViewsAndOneHead) {
  using T = TypeParam;
  Random random(13);
  // (B, Lq, H, Lk) storage viewed as (B, H, Lq, Lk): the heads are strided.
  const Tensor<T, 4> storage = random.normal_tensor<T, 4>({2, 3, 2, 4});
  const TensorView<const T, 4> w = TensorView<const T, 4>(storage).permute({0, 2, 1, 3});
  const Tensor<T, 3> mean = average_heads(w);
  for (Index b = 0; b < 2; ++b)
    for (Index i = 0; i < 3; ++i)
      for (Index j = 0; j < 4; ++j) EXPECT_EQ(mean(b, i, j), (storage(b, i, 0, j) + storage(b, i, 1, j)) / T(2));
  // H = 1: the weights themselves.
  const Tensor<T, 4> single = random.normal_tensor<T, 4>({2, 1, 3, 3});
  const Tensor<T, 3> same = average_heads(single);
  for (Index n = 0; n < same.size(); ++n) EXPECT_EQ(same.data()[n], single.data()[n]);
}

TYPED_TEST(HeadsTest, AverageHeadsShapesAndErrors) {
  using T = TypeParam;
  // No head to average over: a ShapeError naming the argument.
  const Tensor<T, 4> no_heads({2, 0, 3, 3});
  expect_error<ShapeError>([&] { (void)average_heads(no_heads); },
                           {"[average_heads]", "weights", "at least one head", "(2, 0, 3, 3)"});
  // Empty B, Lq or Lk: an empty result of the right shape.
  EXPECT_EQ(average_heads(Tensor<T, 4>({0, 2, 3, 3})).shape(), (std::array<Index, 3>{0, 3, 3}));
  EXPECT_EQ(average_heads(Tensor<T, 4>({2, 2, 0, 3})).shape(), (std::array<Index, 3>{2, 0, 3}));
  EXPECT_EQ(average_heads(Tensor<T, 4>({2, 2, 3, 0})).shape(), (std::array<Index, 3>{2, 3, 0}));
  static_assert(std::is_same_v<decltype(average_heads(std::declval<const Tensor<T, 4>&>())), Tensor<T, 3>>);
}

}  // namespace
}  // namespace selfattn::test
