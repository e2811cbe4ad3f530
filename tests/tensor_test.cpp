// tests/tensor_test.cpp — Tensor (owning, contiguous) and TensorView (strided, non-owning): construction,
// access, copies and moves, strides, conversions, slicing, permute, reshape, Eigen maps, views of row-major
// Eigen matrices (as_view) and the element-wise sum (+, +=).
#include <selfattn/half_precision.hpp>
#include <selfattn/tensor.hpp>

#include "support/compare.hpp"
#include "support/expect_error.hpp"
#include "support/random.hpp"
#include "support/scalars.hpp"

#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace selfattn::test {
namespace {

SELFATTN_SCALAR_TEST_SUITE(TensorTest);

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

// Storage at 64 bytes (detail::tensor_alignment) for every way a tensor gets storage: a shape, a copy of a view, a
// copy of a tensor; sizes not a multiple of a packet, one element, none; every element type.
TEST(TensorAlignment, StorageIsAlignedToACacheLine) {
  const auto aligned = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 64 == 0; };
  std::vector<Tensor<float, 2>> keep;  // alive together, so that each comes from a fresh allocation
  for (Index n : {1, 3, 17, 100, 1000}) {
    keep.emplace_back(std::array<Index, 2>{n, 3});
    EXPECT_TRUE(aligned(keep.back().data())) << n;
    for (Index i = 0; i < keep.back().size(); ++i) ASSERT_EQ(keep.back().data()[i], 0.0f) << "zero-initialised";
    const Tensor<float, 2> copy(keep.back());
    EXPECT_TRUE(aligned(copy.data())) << n;
    const Tensor<float, 2> from_view(TensorView<const float, 2>(keep.back().view()));
    EXPECT_TRUE(aligned(from_view.data())) << n;
  }
  EXPECT_TRUE(aligned(Tensor<double, 1>(std::array<Index, 1>{5}).data()));
  EXPECT_TRUE(aligned(Tensor<bfloat16, 1>(std::array<Index, 1>{5}).data()));
  EXPECT_TRUE(aligned(Tensor<float16, 1>(std::array<Index, 1>{5}).data()));
  EXPECT_TRUE(aligned(Tensor<bool, 1>(std::array<Index, 1>{5}).data()));
  const Tensor<float, 2> none({0, 4});
  EXPECT_EQ(none.size(), 0);
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

// ---- Size limits: counts, strides and offsets that would wrap throw std::length_error, before allocating -------

// 2^62 floats: the element count fits in Index, but its 2^64 bytes wrapped to 0 and the zeroing wrote past a tiny
// buffer (a segmentation fault). The limit is PTRDIFF_MAX bytes: 2^61 - 1 floats, (2^63 - 1) / 8 doubles.
TEST(TensorSizeLimits, ShapeTooLargeForMemoryThrowsLengthError) {
  const Index limit_float = detail::max_elements(sizeof(float)), limit_double = detail::max_elements(sizeof(double));
  EXPECT_EQ(limit_float, (Index{1} << 61) - 1);
  expect_error<std::length_error>([] { Tensor<float, 3>({1 << 20, 1 << 20, 1 << 22}); },
                                  {"[Tensor]", "shape", "(1048576, 1048576, 4194304)", std::to_string(limit_float)});
  // 2^64 elements wrap Index itself (to 0).
  expect_error<std::length_error>([] { Tensor<double, 2>({Index{1} << 32, Index{1} << 32}); },
                                  {"[Tensor]", "shape", "(4294967296, 4294967296)", std::to_string(limit_double)});
  // No element, but the first row-major stride (2^80) would wrap.
  expect_error<std::length_error>([] { Tensor<float, 3>({0, Index{1} << 40, Index{1} << 40}); }, {"[Tensor]", "shape"});
  // A negative extent stays std::invalid_argument, checked first.
  EXPECT_THROW((Tensor<float, 2>({-1, Index{1} << 62})), std::invalid_argument);
}

// A view allocates nothing: its shape may reach the limit exactly, one more element throws.
TEST(TensorSizeLimits, ContiguousViewsUpToTheLimit) {
  float buffer[4] = {};
  const Index limit = detail::max_elements(sizeof(float));
  EXPECT_EQ((TensorView<float, 1>(buffer, {limit})).size(), limit);
  expect_error<std::length_error>([&] { TensorView<float, 1>(buffer, {limit + 1}); },
                                  {"[TensorView]", "shape", std::to_string(limit + 1), std::to_string(limit)});
  expect_error<std::length_error>([&] { TensorView<float, 2>(buffer, {Index{1} << 62, 4}); },
                                  {"[TensorView]", "shape"});
}

// A strided view's last element, 1 + sum (dim - 1) * stride elements from its first, must be addressable: otherwise
// its offsets (operator(), operator[], the kernels' row pointers) wrap.
TEST(TensorSizeLimits, ViewWhoseOffsetsWrapThrowsLengthError) {
  float buffer[8] = {};
  const Index limit = detail::max_elements(sizeof(float));
  // 1 + 2^62 + 2^62 + 3 wraps Index.
  expect_error<std::length_error>(
      [&] { TensorView<float, 3>(buffer, {2, 2, 4}, {Index{1} << 62, Index{1} << 62, 1}); },
      {"[TensorView]", "strides", "(2, 2, 4)", "(4611686018427387904, 4611686018427387904, 1)", std::to_string(limit)});
  // 2^61 + 4 floats fit in Index but not in bytes; the same span of bools does.
  expect_error<std::length_error>([&] { TensorView<float, 2>(buffer, {2, 4}, {Index{1} << 61, 1}); },
                                  {"[TensorView]", "strides"});
  bool flags[8] = {};
  EXPECT_NO_THROW((TensorView<bool, 2>(flags, {2, 4}, {Index{1} << 61, 1})));
  // Stride 0 shows the same row again: a count beyond memory is fine for a view (up to PTRDIFF_MAX elements), not
  // for a Tensor copied from it.
  const TensorView<const float, 2> repeated(buffer, {Index{1} << 60, 4}, {0, 1});
  EXPECT_EQ(repeated.size(), Index{1} << 62);
  expect_error<std::length_error>([&] { Tensor<float, 2> copy(repeated); },
                                  {"[Tensor]", "shape", "(1152921504606846976, 4)"});
  expect_error<std::length_error>([&] { TensorView<float, 2>(buffer, {Index{1} << 62, 4}, {0, 1}); },
                                  {"[TensorView]", "shape"});
}

// (2^62 + 1) * 4 wraps to 4: reshaping 4 elements to it passed the size comparison and made a view of 2^62 rows.
TEST(TensorSizeLimits, ReshapeToAWrappingShapeThrowsLengthError) {
  float buffer[4] = {};
  const TensorView<float, 1> v(buffer, {4});
  expect_error<std::length_error>([&] { v.reshape(std::array<Index, 2>{(Index{1} << 62) + 1, 4}); },
                                  {"[TensorView::reshape]", "shape", "(4611686018427387905, 4)"});
  EXPECT_EQ(v.reshape(std::array<Index, 2>{2, 2}).dim(0), 2);
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

// ---- as_view: row-major Eigen matrices as views ------------------------------------------------------

// Whether as_view accepts an argument of type M (an unevaluated call: column-major storage fails a static_assert
// inside the body, which this cannot see, so only the overload set is probed here; the compile-failure tests
// check the static_assert's sentence).
template <typename M, typename = void>
struct as_view_accepts : std::false_type {};
template <typename M>
struct as_view_accepts<M, std::void_t<decltype(as_view(std::declval<M>()))>> : std::true_type {};

TYPED_TEST(TensorTest, AsViewOfARowMajorMatrixSharesItsMemory) {
  using T = TypeParam;
  RowMajorMatrix<T> m(3, 5);
  for (Index i = 0; i < 3; ++i)
    for (Index j = 0; j < 5; ++j) m(i, j) = static_cast<T>(10 * i + j);
  const TensorView<T, 2> v = as_view(m);
  EXPECT_EQ(v.data(), m.data());
  EXPECT_EQ(v.shape(), (std::array<Index, 2>{3, 5}));
  EXPECT_EQ(v.strides(), (std::array<Index, 2>{5, 1}));
  for (Index i = 0; i < 3; ++i)
    for (Index j = 0; j < 5; ++j) EXPECT_EQ(v(i, j), m(i, j)) << "not transposed at (" << i << ", " << j << ")";
  v(2, 4) = T(-1);  // writes through
  EXPECT_EQ(m(2, 4), T(-1));
  // The round trip through as_matrix is the identity.
  EXPECT_EQ(as_matrix(v), m);

  // A const matrix, or a map of const data, gives a const view.
  const RowMajorMatrix<T>& cm = m;
  static_assert(std::is_same_v<decltype(as_view(cm)), TensorView<const T, 2>>);
  const Eigen::Map<const RowMajorMatrix<T>> const_map(m.data(), 3, 5);
  static_assert(std::is_same_v<decltype(as_view(const_map)), TensorView<const T, 2>>);
  EXPECT_EQ(as_view(const_map)(1, 3), T(13));
  // A writable map gives a writable view.
  Eigen::Map<RowMajorMatrix<T>> map(m.data(), 3, 5);
  static_assert(std::is_same_v<decltype(as_view(map)), TensorView<T, 2>>);
  as_view(map)(0, 0) = T(7);
  EXPECT_EQ(m(0, 0), T(7));
}

TYPED_TEST(TensorTest, AsViewOfBlocksAndStridedMapsKeepsTheRowStride) {
  using T = TypeParam;
  RowMajorMatrix<T> m(4, 6);
  for (Index i = 0; i < 4; ++i)
    for (Index j = 0; j < 6; ++j) m(i, j) = static_cast<T>(10 * i + j);
  // A block: rows 1..2, columns 2..4, row stride 6.
  auto block = m.block(1, 2, 2, 3);
  const TensorView<T, 2> b = as_view(block);
  EXPECT_EQ(b.shape(), (std::array<Index, 2>{2, 3}));
  EXPECT_EQ(b.strides(), (std::array<Index, 2>{6, 1}));
  EXPECT_EQ(b(1, 2), T(24));
  b(0, 0) = T(-5);
  EXPECT_EQ(m(1, 2), T(-5));
  // A temporary block of m is a view of m, not a temporary matrix: accepted, read-only.
  EXPECT_EQ(as_view(m.block(2, 1, 2, 2))(1, 1), T(32));
  // One row: a (1, 6) view.
  auto row = m.row(3);
  EXPECT_EQ(as_view(row).shape(), (std::array<Index, 2>{1, 6}));
  EXPECT_EQ(as_view(row)(0, 5), T(35));
  // A map with an outer stride: every other row of a (4, 6) buffer.
  Eigen::Map<RowMajorMatrix<T>, Eigen::Unaligned, Eigen::OuterStride<>> every_other(m.data(), 2, 6,
                                                                                    Eigen::OuterStride<>(12));
  const TensorView<T, 2> e = as_view(every_other);
  EXPECT_EQ(e.strides(), (std::array<Index, 2>{12, 1}));
  EXPECT_EQ(e(1, 4), m(2, 4));
  // A map with a run-time inner stride other than 1 cannot be a view (rows must be contiguous).
  Eigen::Map<RowMajorMatrix<T>, Eigen::Unaligned, Eigen::Stride<Eigen::Dynamic, Eigen::Dynamic>> gapped(
      m.data(), 2, 3, Eigen::Stride<Eigen::Dynamic, Eigen::Dynamic>(6, 2));
  EXPECT_THROW(as_view(gapped), std::invalid_argument);

  // Temporaries of a matrix would dangle: refused by overload resolution.
  static_assert(!as_view_accepts<RowMajorMatrix<T>>::value);
  static_assert(as_view_accepts<RowMajorMatrix<T>&>::value);
  static_assert(as_view_accepts<const RowMajorMatrix<T>&>::value);
  // A fixed-size row-major matrix works as well.
  Eigen::Matrix<T, 2, 3, Eigen::RowMajor> fixed;
  fixed << T(1), T(2), T(3), T(4), T(5), T(6);
  EXPECT_EQ(as_view(fixed)(1, 0), T(4));
  EXPECT_EQ(as_view(fixed).strides(), (std::array<Index, 2>{3, 1}));
}

TYPED_TEST(TensorTest, AsViewFeedsTheTensorFunctions) {
  using T = TypeParam;
  RowMajorMatrix<T> a(2, 3), b(2, 3);
  a << T(1), T(2), T(3), T(4), T(5), T(6);
  b.setConstant(T(10));
  const Tensor<T, 2> sum = as_view(a) + as_view(b);
  EXPECT_EQ(sum(1, 2), T(16));
  as_view(a) += as_view(b);
  EXPECT_EQ(a(0, 1), T(12));
  const Tensor<T, 2> copy(as_view(static_cast<const RowMajorMatrix<T>&>(a)));
  EXPECT_EQ(copy(1, 0), T(14));
}

// ---- Element-wise sum -------------------------------------------------------------------------------

// Whether `x + y` and `x += y` compile for these operand types.
template <typename X, typename Y, typename = void>
struct has_plus : std::false_type {};
template <typename X, typename Y>
struct has_plus<X, Y, std::void_t<decltype(std::declval<X>() + std::declval<Y>())>> : std::true_type {};

TYPED_TEST(TensorTest, PlusOfTensorsAndViewsOfOneShape) {
  using T = TypeParam;
  Random random(31);
  const Tensor<T, 3> a = random.normal_tensor<T, 3>({2, 3, 4});
  const Tensor<T, 3> b = random.normal_tensor<T, 3>({2, 3, 4});
  const Tensor<T, 3> s = a + b;
  EXPECT_EQ(s.shape(), a.shape());
  for (Index n = 0; n < s.size(); ++n) EXPECT_EQ(s.data()[n], a.data()[n] + b.data()[n]) << "at " << n;

  // Any mix of Tensor and (const or mutable) TensorView.
  Tensor<T, 3> mutable_b = b;
  const TensorView<T, 3> vb = mutable_b;
  const TensorView<const T, 3> va = a;
  EXPECT_TRUE(all_close(a + vb, s, 0.0));
  EXPECT_TRUE(all_close(va + b, s, 0.0));
  EXPECT_TRUE(all_close(va + vb, s, 0.0));
  // Chains; a temporary left operand is reused as the result.
  const Tensor<T, 3> three = a + b + a;
  for (Index n = 0; n < three.size(); ++n) EXPECT_EQ(three.data()[n], (a.data()[n] + b.data()[n]) + a.data()[n]);
  Tensor<T, 3> temporary = a;
  const T* storage = temporary.data();
  const Tensor<T, 3> reused = std::move(temporary) + b;
  EXPECT_EQ(reused.data(), storage);
  EXPECT_TRUE(all_close(reused, s, 0.0));

  // Strided operands: a permuted view plus a column block, into a contiguous result.
  const Tensor<T, 3> wide = random.normal_tensor<T, 3>({3, 2, 6});
  const TensorView<const T, 3> permuted = TensorView<const T, 3>(wide).permute({1, 0, 2});  // (2, 3, 6)
  const TensorView<const T, 3> columns(wide.data() + 1, {2, 3, 4}, {6, 12, 1});           // wide(i, b, 1..4)
  const TensorView<const T, 3> left(permuted.data(), {2, 3, 4}, permuted.strides());     // wide(i, b, 0..3)
  const Tensor<T, 3> strided = left + columns;
  for (Index x = 0; x < 2; ++x)
    for (Index y = 0; y < 3; ++y)
      for (Index z = 0; z < 4; ++z) ASSERT_EQ(strided(x, y, z), wide(y, x, z) + wide(y, x, z + 1));

  // Other ranks, and empty tensors.
  const Tensor<T, 1> one = random.normal_tensor<T, 1>({5});
  EXPECT_EQ((one + one)(4), one(4) + one(4));
  const Tensor<T, 4> four = random.normal_tensor<T, 4>({2, 1, 3, 2});
  EXPECT_EQ((four + four)(1, 0, 2, 1), four(1, 0, 2, 1) * T(2));
  EXPECT_TRUE((Tensor<T, 2>({0, 3}) + Tensor<T, 2>({0, 3})).empty());
  EXPECT_EQ((Tensor<T, 2>() + Tensor<T, 2>()).data(), nullptr);

  // Only tensors of one element type and rank (a mix fails a static_assert: not probed here); never Eigen's
  // or anyone else's types.
  static_assert(has_plus<const Tensor<T, 2>&, const TensorView<const T, 2>&>::value);
  static_assert(!has_plus<const Tensor<T, 2>&, const RowMajorMatrix<T>&>::value);
  static_assert(!has_plus<const Tensor<T, 2>&, T>::value);
}

TYPED_TEST(TensorTest, PlusEqualsOnTensorsAndViews) {
  using T = TypeParam;
  Random random(32);
  const Tensor<T, 3> a = random.normal_tensor<T, 3>({2, 3, 4});
  const Tensor<T, 3> b = random.normal_tensor<T, 3>({2, 3, 4});
  Tensor<T, 3> x = a;
  Tensor<T, 3>& same = (x += b);
  EXPECT_EQ(&same, &x);
  EXPECT_TRUE(all_close(x, a + b, 0.0));
  x += TensorView<const T, 3>(a);
  for (Index n = 0; n < x.size(); ++n) EXPECT_EQ(x.data()[n], (a.data()[n] + b.data()[n]) + a.data()[n]);

  // Into a slice of a tensor, through a view: only that slice changes.
  Tensor<T, 3> y = a;
  const Tensor<T, 2> row_block = random.normal_tensor<T, 2>({3, 4});
  y[1] += row_block;
  for (Index i = 0; i < 3; ++i)
    for (Index j = 0; j < 4; ++j) {
      EXPECT_EQ(y(0, i, j), a(0, i, j));
      EXPECT_EQ(y(1, i, j), a(1, i, j) + row_block(i, j));
    }
  // Into a strided view (a column block) from another strided view.
  Tensor<T, 2> wide = random.normal_tensor<T, 2>({3, 6});
  const Tensor<T, 2> before = wide;
  const Tensor<T, 2> other = random.normal_tensor<T, 2>({3, 5});
  const TensorView<T, 2> block(wide.data() + 2, {3, 3}, {6, 1});          // wide(:, 2..4)
  const TensorView<const T, 2> source(other.data() + 1, {3, 3}, {5, 1});  // other(:, 1..3)
  block += source;
  for (Index i = 0; i < 3; ++i)
    for (Index j = 0; j < 6; ++j)
      EXPECT_EQ(wide(i, j), j >= 2 && j < 5 ? before(i, j) + other(i, j - 1) : before(i, j)) << i << ", " << j;

  // x += x doubles (same memory, same layout is fine).
  Tensor<T, 3> z = a;
  z += z;
  for (Index n = 0; n < z.size(); ++n) EXPECT_EQ(z.data()[n], a.data()[n] * T(2));
}

TYPED_TEST(TensorTest, PlusRejectsShapeMismatchesAndAliasing) {
  using T = TypeParam;
  Tensor<T, 2> a({2, 3}), b({3, 2}), c({2, 4});
  a.fill(T(1));
  expect_error<ShapeError>([&] { (void)(a + b); }, {"[operator+]", "rhs", "expected shape (2, 3)", "got (3, 2)"});
  expect_error<ShapeError>([&] { (void)(a + c.view()); }, {"[operator+]", "rhs", "(2, 4)"});
  expect_error<ShapeError>([&] { (void)(Tensor<T, 2>(a) + b); }, {"[operator+]", "rhs", "got (3, 2)"});
  expect_error<ShapeError>([&] { a += b; }, {"[operator+=]", "rhs", "expected shape (2, 3)", "got (3, 2)"});
  expect_error<ShapeError>([&] { a.view() += c; }, {"[operator+=]", "rhs", "got (2, 4)"});
  for (Index n = 0; n < a.size(); ++n) EXPECT_EQ(a.data()[n], T(1)) << "written before throwing";

  // A destination view that reaches one element twice (stride 0) would add to it twice.
  std::vector<T> row(3, T(0));
  const TensorView<T, 2> repeated(row.data(), {2, 3}, {0, 1});
  expect_error<std::invalid_argument>([&] { repeated += a; }, {"[operator+=]", "lhs", "same element"});
  // A source overlapping the destination in another layout is refused, the tensor is unchanged.
  Tensor<T, 2> square({3, 3});
  for (Index n = 0; n < square.size(); ++n) square.data()[n] = static_cast<T>(n);
  const Tensor<T, 2> kept = square;
  const TensorView<const T, 2> shifted(square.data() + 1, {3, 2}, {3, 1});
  const TensorView<T, 2> left(square.data(), {3, 2}, {3, 1});
  expect_error<std::invalid_argument>([&] { left += shifted; }, {"[operator+=]", "rhs", "overlaps lhs"});
  EXPECT_TRUE(all_close(square, kept, 0.0));
}

TEST(TensorSum, IntegerTensorsAddToo) {
  Tensor<int, 2> a({2, 2}), b({2, 2});
  a.fill(3);
  b.fill(-1);
  a += b;
  EXPECT_EQ((a + b)(1, 1), 1);
  Tensor<std::int64_t, 1> c({3});
  c.fill(5);
  EXPECT_EQ((c + c)(2), 10);
}

}  // namespace
}  // namespace selfattn::test
