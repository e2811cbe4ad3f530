// tests/tensor_test.cpp — Tensor (owning, contiguous) and TensorView (strided, non-owning): construction,
// access, copies and moves, strides, conversions, slicing, permute, reshape and Eigen maps.
#include <selfattn/tensor.hpp>

#include "support/compare.hpp"
#include "support/random.hpp"

#include <gtest/gtest.h>

#include <array>
#include <stdexcept>
#include <type_traits>
#include <utility>
#include <vector>

namespace selfattn {
namespace {

using test::all_close;
using test::Random;

template <typename T>
class TensorTest : public ::testing::Test {};
using Scalars = ::testing::Types<float, double>;
TYPED_TEST_SUITE(TensorTest, Scalars, );

// Fills a tensor with its flat index: element n is n, so every position is distinguishable.
template <typename T, int Rank>
void iota(Tensor<T, Rank>& t) {
  for (Index n = 0; n < t.size(); ++n) t.data()[n] = static_cast<T>(n);
}

// Sums a const view; exists to check implicit conversions at a call site.
template <typename T>
T sum_of(const TensorView<const T, 2>& v) {
  T total = 0;
  for (Index i = 0; i < v.dim(0); ++i)
    for (Index j = 0; j < v.dim(1); ++j) total += v(i, j);
  return total;
}

// ---- Tensor ---------------------------------------------------------------------------------------

TYPED_TEST(TensorTest, ConstructsFromBracedShapeZeroInitialised) {
  using T = TypeParam;
  Tensor<T, 3> x({2, 3, 4});
  EXPECT_EQ(x.shape(), (std::array<Index, 3>{2, 3, 4}));
  EXPECT_EQ(x.dim(0), 2);
  EXPECT_EQ(x.dim(1), 3);
  EXPECT_EQ(x.dim(2), 4);
  EXPECT_EQ(x.size(), 24);
  EXPECT_FALSE(x.empty());
  ASSERT_NE(x.data(), nullptr);
  for (Index n = 0; n < x.size(); ++n) EXPECT_EQ(x.data()[n], T(0)) << "at " << n;
  EXPECT_EQ(x.strides(), (std::array<Index, 3>{12, 4, 1}));
}

TYPED_TEST(TensorTest, ConstructsFromStdArray) {
  using T = TypeParam;
  const std::array<Index, 2> shape{5, 7};
  Tensor<T, 2> x(shape);
  EXPECT_EQ(x.shape(), shape);
  EXPECT_EQ(x.size(), 35);
  for (Index n = 0; n < x.size(); ++n) EXPECT_EQ(x.data()[n], T(0));

  Tensor<T, 1> v(std::array<Index, 1>{3});
  EXPECT_EQ(v.size(), 3);
  EXPECT_EQ(v.dim(0), 3);
}

TYPED_TEST(TensorTest, DefaultAndZeroExtentAreEmpty) {
  using T = TypeParam;
  const Tensor<T, 3> e;
  EXPECT_EQ(e.size(), 0);
  EXPECT_TRUE(e.empty());
  EXPECT_EQ(e.data(), nullptr);

  const Tensor<T, 3> z({0, 3, 4});
  EXPECT_EQ(z.size(), 0);
  EXPECT_TRUE(z.empty());
  EXPECT_EQ(z.shape(), (std::array<Index, 3>{0, 3, 4}));
  EXPECT_EQ(z.dim(1), 3);
}

TYPED_TEST(TensorTest, ElementAccessIsRowMajor) {
  using T = TypeParam;
  Tensor<T, 3> x({2, 3, 4});
  x(1, 2, 3) = T(0.5);
  x(0, 1, 2) = T(-2);
  EXPECT_EQ(x.data()[1 * 12 + 2 * 4 + 3], T(0.5));
  EXPECT_EQ(x.data()[0 * 12 + 1 * 4 + 2], T(-2));
  const Tensor<T, 3>& cx = x;
  EXPECT_EQ(cx(1, 2, 3), T(0.5));
  static_assert(std::is_same_v<decltype(cx(0, 0, 0)), const T&>, "const tensor gives const access");
  // Every other element is still zero.
  Index nonzero = 0;
  for (Index n = 0; n < x.size(); ++n) nonzero += x.data()[n] != T(0);
  EXPECT_EQ(nonzero, 2);
}

TYPED_TEST(TensorTest, CopyIsDeep) {
  using T = TypeParam;
  Random random(11);
  Tensor<T, 3> x = random.normal_tensor<T, 3>({2, 3, 5});
  const Tensor<T, 3> original = x;  // a second copy to compare against
  Tensor<T, 3> y = x;
  EXPECT_NE(y.data(), x.data());
  EXPECT_EQ(y.shape(), x.shape());
  EXPECT_TRUE(all_close(y, x, 0.0));
  y(1, 2, 4) = T(100);
  y(0, 0, 0) = T(-100);
  EXPECT_EQ(x(1, 2, 4), original(1, 2, 4));
  EXPECT_EQ(x(0, 0, 0), original(0, 0, 0));

  Tensor<T, 3> z({1, 1, 1});
  z = x;  // copy assignment
  EXPECT_EQ(z.shape(), x.shape());
  EXPECT_NE(z.data(), x.data());
  z(0, 1, 1) = T(7);
  EXPECT_EQ(x(0, 1, 1), original(0, 1, 1));
  EXPECT_TRUE(all_close(x, original, 0.0));
}

TYPED_TEST(TensorTest, CopyOfAnAbsentTensorStaysAbsent) {
  using T = TypeParam;
  const Tensor<T, 1> absent;
  const Tensor<T, 1> copy = absent;  // e.g. a module without biases, copied
  EXPECT_TRUE(copy.empty());
  EXPECT_EQ(copy.data(), nullptr);
  Tensor<T, 1> assigned(std::array<Index, 1>{4});
  assigned = absent;
  EXPECT_TRUE(assigned.empty());
  EXPECT_EQ(assigned.data(), nullptr);
}

TYPED_TEST(TensorTest, MoveLeavesSourceEmpty) {
  using T = TypeParam;
  Tensor<T, 2> x({3, 4});
  iota(x);
  const T* storage = x.data();
  Tensor<T, 2> y = std::move(x);
  EXPECT_EQ(y.data(), storage);  // moved, not copied
  EXPECT_EQ(y.shape(), (std::array<Index, 2>{3, 4}));
  EXPECT_EQ(y(2, 3), T(11));
  EXPECT_EQ(x.size(), 0);  // NOLINT(bugprone-use-after-move): the moved-from state is specified
  EXPECT_TRUE(x.empty());

  Tensor<T, 2> z({1, 1});
  z = std::move(y);
  EXPECT_EQ(z.data(), storage);
  EXPECT_EQ(z.shape(), (std::array<Index, 2>{3, 4}));
  EXPECT_TRUE(y.empty());  // NOLINT(bugprone-use-after-move)
  EXPECT_EQ(y.size(), 0);
}

TEST(TensorBool, DataIsWritable) {
  Tensor<bool, 4> m({1, 1, 5, 5});
  bool* p = m.data();
  ASSERT_NE(p, nullptr);
  for (Index n = 0; n < m.size(); ++n) EXPECT_FALSE(p[n]);
  for (Index i = 0; i < 5; ++i)
    for (Index j = 0; j <= i; ++j) p[i * 5 + j] = true;  // lower triangle
  EXPECT_TRUE(m(0, 0, 3, 2));
  EXPECT_FALSE(m(0, 0, 2, 3));
  m(0, 0, 0, 4) = true;
  EXPECT_TRUE(p[4]);
  const TensorView<const bool, 4> v = m;
  EXPECT_TRUE(v(0, 0, 4, 4));
}

TEST(TensorErrors, NegativeExtentThrows) {
  EXPECT_THROW((Tensor<float, 2>({2, -1})), std::invalid_argument);
  EXPECT_THROW((Tensor<double, 3>({-1, 2, 3})), std::invalid_argument);
  float buffer[4] = {};
  EXPECT_THROW((TensorView<float, 2>(buffer, {-2, 2})), std::invalid_argument);
}

// ---- TensorView -----------------------------------------------------------------------------------

TYPED_TEST(TensorTest, ViewWrapsCallerMemoryContiguously) {
  using T = TypeParam;
  std::vector<T> buffer(6);
  for (std::size_t n = 0; n < buffer.size(); ++n) buffer[n] = static_cast<T>(n + 1);
  TensorView<T, 2> w(buffer.data(), {2, 3});
  EXPECT_EQ(w.data(), buffer.data());
  EXPECT_EQ(w.shape(), (std::array<Index, 2>{2, 3}));
  EXPECT_EQ(w.strides(), (std::array<Index, 2>{3, 1}));
  EXPECT_EQ(w.size(), 6);
  EXPECT_FALSE(w.empty());
  EXPECT_TRUE(w.is_contiguous());
  EXPECT_EQ(w(1, 0), T(4));
  EXPECT_EQ(w(0, 2), T(3));
  w(1, 2) = T(-9);
  EXPECT_EQ(buffer[5], T(-9));

  const TensorView<T, 2> absent;
  EXPECT_TRUE(absent.empty());
  EXPECT_EQ(absent.data(), nullptr);
}

TYPED_TEST(TensorTest, ViewOfAMatrixColumn) {
  using T = TypeParam;
  Tensor<T, 2> m({4, 5});
  iota(m);
  // Column 2 as a (4, 1) view: row stride 5.
  TensorView<T, 2> column(m.data() + 2, {4, 1}, {5, 1});
  EXPECT_EQ(column.stride(0), 5);
  EXPECT_FALSE(column.is_contiguous());
  for (Index i = 0; i < 4; ++i) EXPECT_EQ(column(i, 0), m(i, 2)) << "row " << i;
  column(3, 0) = T(-1);
  EXPECT_EQ(m(3, 2), T(-1));
  EXPECT_EQ(m(3, 1), T(16));  // neighbours untouched
  EXPECT_EQ(m(3, 3), T(18));

  // Columns 1..3 as a (4, 3) block.
  const TensorView<const T, 2> block(m.data() + 1, {4, 3}, {5, 1});
  for (Index i = 0; i < 4; ++i)
    for (Index j = 0; j < 3; ++j) EXPECT_EQ(block(i, j), m(i, j + 1));
}

TYPED_TEST(TensorTest, ViewWithBroadcastStride) {
  using T = TypeParam;
  const std::vector<T> row{T(1.5), T(-2), T(3)};
  // Stride 0 in dim 0: four copies of the same row, no storage of its own.
  const TensorView<const T, 2> broadcast(row.data(), {4, 3}, {0, 1});
  EXPECT_EQ(broadcast.size(), 12);
  EXPECT_FALSE(broadcast.is_contiguous());
  for (Index i = 0; i < 4; ++i)
    for (Index j = 0; j < 3; ++j) EXPECT_EQ(broadcast(i, j), row[static_cast<std::size_t>(j)]);
  const Tensor<T, 2> dense(broadcast);
  EXPECT_EQ(dense.shape(), (std::array<Index, 2>{4, 3}));
  for (Index i = 0; i < 4; ++i)
    for (Index j = 0; j < 3; ++j) EXPECT_EQ(dense.data()[i * 3 + j], row[static_cast<std::size_t>(j)]);

  // A (2, 1, 3) mask-like view with a broadcast middle dim of extent 4.
  const TensorView<const T, 3> middle(row.data(), {2, 4, 3}, {0, 0, 1});
  EXPECT_EQ(middle(1, 3, 2), T(3));
}

TYPED_TEST(TensorTest, LastStrideMustBeOne) {
  using T = TypeParam;
  std::vector<T> buffer(12);
  EXPECT_THROW((TensorView<T, 2>(buffer.data(), {2, 3}, {6, 2})), std::invalid_argument);
  EXPECT_THROW((TensorView<T, 3>(buffer.data(), {2, 2, 2}, {4, 2, 0})), std::invalid_argument);
  EXPECT_NO_THROW((TensorView<T, 2>(buffer.data(), {2, 3}, {6, 1})));
}

TYPED_TEST(TensorTest, NegativeStrideThrows) {
  using T = TypeParam;
  std::vector<T> buffer(12);
  EXPECT_THROW((TensorView<T, 2>(buffer.data() + 9, {4, 3}, {-3, 1})), std::invalid_argument);
  EXPECT_THROW((TensorView<T, 3>(buffer.data() + 6, {2, 2, 3}, {6, -3, 1})), std::invalid_argument);
}

TYPED_TEST(TensorTest, ImplicitConversionsToConstViews) {
  using T = TypeParam;
  static_assert(std::is_convertible_v<Tensor<T, 2>&, TensorView<const T, 2>>);
  static_assert(std::is_convertible_v<const Tensor<T, 2>&, TensorView<const T, 2>>);
  static_assert(std::is_convertible_v<Tensor<T, 2>&, TensorView<T, 2>>);
  static_assert(std::is_convertible_v<TensorView<T, 2>, TensorView<const T, 2>>);
  // Constness is never dropped.
  static_assert(!std::is_convertible_v<const Tensor<T, 2>&, TensorView<T, 2>>);
  static_assert(!std::is_convertible_v<TensorView<const T, 2>, TensorView<T, 2>>);

  Tensor<T, 2> x({2, 3});
  iota(x);  // 0..5, sum 15
  const TensorView<const T, 2> v = x;
  EXPECT_EQ(v.data(), x.data());
  EXPECT_EQ(v.shape(), x.shape());
  EXPECT_EQ(sum_of<T>(x), T(15));  // Tensor -> TensorView<const T> at a call site

  TensorView<T, 2> w = x;
  const TensorView<const T, 2> cw = w;
  EXPECT_EQ(cw.data(), w.data());
  EXPECT_EQ(cw.strides(), w.strides());
  EXPECT_EQ(sum_of<T>(w), T(15));  // TensorView<T> -> TensorView<const T>
  w(0, 0) = T(10);
  EXPECT_EQ(cw(0, 0), T(10));  // same memory
  EXPECT_EQ(sum_of<T>(x), T(25));

  // A strided view keeps its strides through the conversion.
  const TensorView<T, 2> strided(x.data() + 1, {2, 2}, {3, 1});
  const TensorView<const T, 2> cs = strided;
  EXPECT_EQ(cs.strides(), (std::array<Index, 2>{3, 1}));
  EXPECT_EQ(cs(1, 1), x(1, 2));
}

TYPED_TEST(TensorTest, FirstDimensionSlicing) {
  using T = TypeParam;
  Tensor<T, 3> x({2, 3, 4});
  iota(x);
  TensorView<T, 2> s = x[1];
  EXPECT_EQ(s.shape(), (std::array<Index, 2>{3, 4}));
  EXPECT_EQ(s.data(), x.data() + 12);
  for (Index i = 0; i < 3; ++i)
    for (Index j = 0; j < 4; ++j) EXPECT_EQ(s(i, j), x(1, i, j));
  TensorView<T, 1> r = x[1][2];
  EXPECT_EQ(r.dim(0), 4);
  EXPECT_EQ(r(3), x(1, 2, 3));
  r(0) = T(-5);
  EXPECT_EQ(x(1, 2, 0), T(-5));

  const Tensor<T, 3>& cx = x;
  static_assert(std::is_same_v<decltype(cx[0]), TensorView<const T, 2>>, "a const tensor slices to a const view");

  // Slicing a permuted view keeps its strides.
  const TensorView<T, 3> p = x.view().permute({1, 0, 2});  // (3, 2, 4)
  const TensorView<T, 2> ps = p[2];                          // x(:, 2, :)
  EXPECT_EQ(ps.shape(), (std::array<Index, 2>{2, 4}));
  EXPECT_EQ(ps.stride(0), 12);
  for (Index b = 0; b < 2; ++b)
    for (Index j = 0; j < 4; ++j) EXPECT_EQ(ps(b, j), x(b, 2, j));
}

TYPED_TEST(TensorTest, PermuteMovesValues) {
  using T = TypeParam;
  Random random(3);
  Tensor<T, 4> x = random.normal_tensor<T, 4>({2, 3, 5, 4});
  const TensorView<T, 4> p = x.view().permute({0, 2, 1, 3});  // (2, 5, 3, 4)
  EXPECT_EQ(p.shape(), (std::array<Index, 4>{2, 5, 3, 4}));
  EXPECT_EQ(p.strides(), (std::array<Index, 4>{60, 4, 20, 1}));
  EXPECT_EQ(p.data(), x.data());
  for (Index a = 0; a < 2; ++a)
    for (Index b = 0; b < 3; ++b)
      for (Index c = 0; c < 5; ++c)
        for (Index d = 0; d < 4; ++d) ASSERT_EQ(p(a, c, b, d), x(a, b, c, d));

  const TensorView<T, 4> q = x.view().permute({2, 0, 1, 3});  // (5, 2, 3, 4)
  EXPECT_EQ(q.shape(), (std::array<Index, 4>{5, 2, 3, 4}));
  EXPECT_EQ(q(4, 1, 2, 3), x(1, 2, 4, 3));
  EXPECT_EQ(q(1, 0, 2, 0), x(0, 2, 1, 0));
}

TYPED_TEST(TensorTest, PermuteRejectsBadOrders) {
  using T = TypeParam;
  Tensor<T, 3> x({2, 3, 4});
  EXPECT_THROW(x.view().permute({2, 1, 0}), std::invalid_argument);  // moves the last dim
  EXPECT_THROW(x.view().permute({0, 2, 1}), std::invalid_argument);  // moves the last dim
  EXPECT_THROW(x.view().permute({0, 0, 2}), std::invalid_argument);  // repeated
  EXPECT_THROW(x.view().permute({3, 0, 2}), std::invalid_argument);  // out of range
  EXPECT_THROW(x.view().permute({-1, 1, 2}), std::invalid_argument);
  EXPECT_NO_THROW(x.view().permute({1, 0, 2}));
}

TYPED_TEST(TensorTest, Reshape) {
  using T = TypeParam;
  Tensor<T, 3> x({2, 3, 4});
  iota(x);
  const TensorView<T, 2> r = x.view().reshape(std::array<Index, 2>{6, 4});
  EXPECT_EQ(r.shape(), (std::array<Index, 2>{6, 4}));
  EXPECT_EQ(r.data(), x.data());
  EXPECT_EQ(r(4, 1), x(1, 1, 1));
  const TensorView<T, 1> flat = x.view().reshape(std::array<Index, 1>{24});
  EXPECT_EQ(flat(23), T(23));
  const TensorView<T, 4> split = x.view().template reshape<4>({2, 3, 2, 2});
  EXPECT_EQ(split(1, 2, 1, 0), x(1, 2, 2));

  EXPECT_THROW(x.view().reshape(std::array<Index, 2>{5, 4}), std::invalid_argument);
  EXPECT_THROW(x.view().reshape(std::array<Index, 2>{6, 5}), std::invalid_argument);
  const TensorView<T, 3> permuted = x.view().permute({1, 0, 2});
  EXPECT_THROW(permuted.reshape(std::array<Index, 2>{6, 4}), std::invalid_argument);
  const TensorView<T, 2> block(x.data(), {6, 2}, {4, 1});
  EXPECT_THROW(block.reshape(std::array<Index, 1>{12}), std::invalid_argument);
}

TYPED_TEST(TensorTest, IsContiguous) {
  using T = TypeParam;
  Tensor<T, 3> x({2, 3, 4});
  EXPECT_TRUE(x.view().is_contiguous());
  EXPECT_TRUE(x.view()[1].is_contiguous());
  EXPECT_FALSE(x.view().permute({1, 0, 2}).is_contiguous());
  EXPECT_FALSE((TensorView<T, 2>(x.data(), {6, 2}, {4, 1}).is_contiguous()));
  // Extents of 1 may carry any stride.
  EXPECT_TRUE((TensorView<T, 2>(x.data(), {1, 4}, {100, 1}).is_contiguous()));
  EXPECT_TRUE((TensorView<T, 3>(x.data(), {2, 1, 4}, {4, 7, 1}).is_contiguous()));
  EXPECT_FALSE((TensorView<T, 3>(x.data(), {2, 1, 4}, {5, 4, 1}).is_contiguous()));
}

TYPED_TEST(TensorTest, AsMatrixOfAStridedSlice) {
  using T = TypeParam;
  Random random(5);
  Tensor<T, 3> x = random.normal_tensor<T, 3>({2, 4, 7});
  // Columns 2..5 of x[1]: a (4, 4) slice with outer stride 7.
  const TensorView<T, 2> slice(x[1].data() + 2, {4, 4}, {7, 1});
  const auto m = as_matrix(slice);
  ASSERT_EQ(m.rows(), 4);
  ASSERT_EQ(m.cols(), 4);
  EXPECT_EQ(m.outerStride(), 7);
  for (Index i = 0; i < 4; ++i)
    for (Index j = 0; j < 4; ++j) EXPECT_EQ(m(i, j), x(1, i, j + 2));
  // Writes through.
  as_matrix(slice)(3, 0) = T(42);
  EXPECT_EQ(x(1, 3, 2), T(42));

  // A slice of a permuted view: rows are heads apart.
  const TensorView<const T, 3> p = TensorView<const T, 3>(x).permute({1, 0, 2});  // (4, 2, 7)
  const auto pm = as_matrix(p[3]);                                                 // x(:, 3, :)
  EXPECT_EQ(pm.rows(), 2);
  EXPECT_EQ(pm.outerStride(), 28);
  for (Index b = 0; b < 2; ++b)
    for (Index j = 0; j < 7; ++j) EXPECT_EQ(pm(b, j), x(b, 3, j));

  // A single row with a large stride.
  const TensorView<const T, 2> one_row(x.data() + 7, {1, 3}, {1000, 1});
  const auto rm = as_matrix(one_row);
  EXPECT_EQ(rm(0, 2), x(0, 1, 2));
}

TYPED_TEST(TensorTest, TensorFromStridedViewIsAContiguousCopy) {
  using T = TypeParam;
  Random random(9);
  Tensor<T, 3> x = random.normal_tensor<T, 3>({3, 4, 5});
  const TensorView<T, 3> p = x.view().permute({1, 0, 2});  // (4, 3, 5)
  ASSERT_FALSE(p.is_contiguous());
  Tensor<T, 3> copy(p);
  EXPECT_EQ(copy.shape(), (std::array<Index, 3>{4, 3, 5}));
  EXPECT_NE(copy.data(), x.data());
  EXPECT_TRUE(copy.view().is_contiguous());
  for (Index a = 0; a < 4; ++a)
    for (Index b = 0; b < 3; ++b)
      for (Index c = 0; c < 5; ++c) ASSERT_EQ(copy.data()[(a * 3 + b) * 5 + c], x(b, a, c));
  const T before = x(0, 0, 0);
  copy(0, 0, 0) = before + T(1);
  EXPECT_EQ(x(0, 0, 0), before);

  // A column block of a wider buffer.
  const TensorView<const T, 3> block(x.data() + 1, {3, 4, 3}, {20, 5, 1});
  const Tensor<T, 3> block_copy(block);
  for (Index a = 0; a < 3; ++a)
    for (Index b = 0; b < 4; ++b)
      for (Index c = 0; c < 3; ++c) ASSERT_EQ(block_copy(a, b, c), x(a, b, c + 1));
}

TYPED_TEST(TensorTest, CopyFrom) {
  using T = TypeParam;
  Random random(21);
  const Tensor<T, 2> source = random.normal_tensor<T, 2>({3, 4});
  Tensor<T, 2> target({4, 3});
  const TensorView<const T, 2> transposed_shape(source.data(), {4, 3});
  target.copy_from(transposed_shape);
  EXPECT_EQ(target(3, 2), source(2, 3));

  Tensor<T, 2> wrong({3, 3});
  wrong.fill(T(7));
  EXPECT_THROW(wrong.copy_from(source), std::invalid_argument);
  for (Index n = 0; n < wrong.size(); ++n) EXPECT_EQ(wrong.data()[n], T(7)) << "written before throwing";

  Tensor<T, 2> columns({3, 2});
  columns.copy_from(TensorView<const T, 2>(source.data() + 1, {3, 2}, {4, 1}));
  for (Index i = 0; i < 3; ++i) {
    EXPECT_EQ(columns(i, 0), source(i, 1));
    EXPECT_EQ(columns(i, 1), source(i, 2));
  }
}

TYPED_TEST(TensorTest, FillAndAsVector) {
  using T = TypeParam;
  Tensor<T, 1> v(std::array<Index, 1>{5});
  v.fill(T(2.5));
  const auto map = as_vector(TensorView<const T, 1>(v));
  EXPECT_EQ(map.size(), 5);
  EXPECT_EQ(map.sum(), T(12.5));
}

}  // namespace
}  // namespace selfattn
