// tests/projection_test.cpp — linear (y = x W^T + b) and linear_backward against brute-force loops on contiguous
// and strided inputs (both GEMM paths), detail::fused_qkv_projection against three linear calls, and errors. ctest
// runs it once more per instruction-set level (SELFATTN_ISA), so the dispatched GEMMs are held to the same loops.
#include <selfattn/projection.hpp>

#include "support/compare.hpp"
#include "support/expect_error.hpp"
#include "support/level_copy.hpp"
#include "support/random.hpp"
#include "support/sanitizers.hpp"
#include "support/scalars.hpp"

#include <gtest/gtest.h>

#include <array>
#include <cstddef>
#include <string>
#include <vector>

namespace selfattn::test {
namespace {

SELFATTN_SCALAR_TEST_SUITE(ProjectionTest);

// y[b, l, o] = sum_i x[b, l, i] W[o, i] + bias[o], accumulated in long double.
template <typename T>
Tensor<T, 3> brute_force_linear(const TensorView<const T, 3>& x, const TensorView<const T, 2>& w,
                                const TensorView<const T, 1>& bias) {
  Tensor<T, 3> y({x.dim(0), x.dim(1), w.dim(0)});
  for (Index b = 0; b < x.dim(0); ++b)
    for (Index l = 0; l < x.dim(1); ++l)
      for (Index o = 0; o < w.dim(0); ++o) {
        long double sum = bias.empty() ? 0.0L : static_cast<long double>(bias(o));
        for (Index i = 0; i < x.dim(2); ++i) sum += static_cast<long double>(x(b, l, i)) * w(o, i);
        y(b, l, o) = static_cast<T>(sum);
      }
  return y;
}

struct LinearShape {
  Index batch, length, in, out;
};

const std::vector<LinearShape>& linear_shapes() {
  static const std::vector<LinearShape> shapes{
      {1, 1, 1, 1}, {1, 1, 5, 3}, {2, 3, 5, 7}, {3, 1, 13, 1}, {1, 7, 4, 9}, {2, 5, 17, 3}, {4, 6, 32, 24}, {3, 11, 33, 65},
  };
  return shapes;
}

std::string describe(const LinearShape& s) {
  return "B=" + std::to_string(s.batch) + " L=" + std::to_string(s.length) + " In=" + std::to_string(s.in) +
         " Out=" + std::to_string(s.out);
}

TYPED_TEST(ProjectionTest, LinearMatchesBruteForceOnContiguousInput) {
  using T = TypeParam;
  Random random(100);
  for (const LinearShape& s : linear_shapes()) {
    SCOPED_TRACE(describe(s));
    const Tensor<T, 3> x = random.normal_tensor<T, 3>({s.batch, s.length, s.in});
    const Tensor<T, 2> w = random.normal_tensor<T, 2>({s.out, s.in});
    const Tensor<T, 1> bias = random.normal_tensor<T, 1>(std::array<Index, 1>{s.out});

    const Tensor<T, 3> with_bias = linear<T>(x, w, bias);
    EXPECT_EQ(with_bias.shape(), (std::array<Index, 3>{s.batch, s.length, s.out}));
    EXPECT_TRUE(all_close(with_bias, brute_force_linear<T>(x, w, bias), default_tolerance<T>()));

    const Tensor<T, 3> without_bias = linear<T>(x, w);
    EXPECT_TRUE(all_close(without_bias, brute_force_linear<T>(x, w, {}), default_tolerance<T>()));
    // An empty bias tensor means "absent", like a default-constructed view.
    const Tensor<T, 1> empty_bias;
    EXPECT_TRUE(all_close(linear<T>(x, w, empty_bias), without_bias, 0.0));
    if (s.out > 0 && s.batch * s.length > 0) {
      // The bias is really added: the two differ by exactly the bias on every row.
      EXPECT_FALSE(all_close(with_bias, without_bias, default_tolerance<T>()));
    }
  }
}

TYPED_TEST(ProjectionTest, LinearOnEvenlyStridedRowsRunsOneGemm) {
  using T = TypeParam;
  // x is a column block of a wider (B, L, In + 5) buffer: rows evenly spaced (batch stride = L * row
  // stride), so all B * L rows go through one GEMM with an outer stride.
  Random random(101);
  for (const LinearShape& s : linear_shapes()) {
    SCOPED_TRACE(describe(s));
    const Index width = s.in + 5;
    const Tensor<T, 3> buffer = random.normal_tensor<T, 3>({s.batch, s.length, width});
    const TensorView<const T, 3> x(buffer.data() + 2, {s.batch, s.length, s.in}, {s.length * width, width, 1});
    ASSERT_EQ(x.stride(0), x.dim(1) * x.stride(1));
    const Tensor<T, 2> w = random.normal_tensor<T, 2>({s.out, s.in});
    const Tensor<T, 1> bias = random.normal_tensor<T, 1>(std::array<Index, 1>{s.out});
    EXPECT_TRUE(all_close(linear<T>(x, w, bias), brute_force_linear<T>(x, w, bias), default_tolerance<T>()));
    EXPECT_TRUE(all_close(linear<T>(x, w), brute_force_linear<T>(x, w, {}), default_tolerance<T>()));
  }
}

TYPED_TEST(ProjectionTest, LinearOnUnevenBatchStrideRunsPerBatchGemms) {
  using T = TypeParam;
  // x is the first L rows and In columns of each batch of a (B, L + 2, In + 3) buffer: the batch stride
  // is not L times the row stride, so each batch is its own GEMM.
  Random random(102);
  for (const LinearShape& s : linear_shapes()) {
    SCOPED_TRACE(describe(s));
    const Index rows = s.length + 2, width = s.in + 3;
    const Tensor<T, 3> buffer = random.normal_tensor<T, 3>({s.batch, rows, width});
    const TensorView<const T, 3> x(buffer.data() + width + 1, {s.batch, s.length, s.in}, {rows * width, width, 1});
    ASSERT_NE(x.stride(0), x.dim(1) * x.stride(1));
    const Tensor<T, 2> w = random.normal_tensor<T, 2>({s.out, s.in});
    const Tensor<T, 1> bias = random.normal_tensor<T, 1>(std::array<Index, 1>{s.out});
    EXPECT_TRUE(all_close(linear<T>(x, w, bias), brute_force_linear<T>(x, w, bias), default_tolerance<T>()));
    EXPECT_TRUE(all_close(linear<T>(x, w), brute_force_linear<T>(x, w, {}), default_tolerance<T>()));
  }
}

// dx = dy W, dW = dy^T x (summed over B and L), db = sum dy, accumulated in long double.
template <typename T>
LinearGradients<T> brute_force_linear_backward(const TensorView<const T, 3>& x, const TensorView<const T, 2>& w,
                                               const TensorView<const T, 3>& dy) {
  const Index batch = x.dim(0), length = x.dim(1), in = x.dim(2), out = w.dim(0);
  LinearGradients<T> g{Tensor<T, 3>(x.shape()), Tensor<T, 2>(w.shape()), Tensor<T, 1>(std::array<Index, 1>{out})};
  for (Index b = 0; b < batch; ++b)
    for (Index l = 0; l < length; ++l)
      for (Index i = 0; i < in; ++i) {
        long double sum = 0;
        for (Index o = 0; o < out; ++o) sum += static_cast<long double>(dy(b, l, o)) * w(o, i);
        g.dx(b, l, i) = static_cast<T>(sum);
      }
  for (Index o = 0; o < out; ++o) {
    long double bias_sum = 0;
    for (Index i = 0; i < in; ++i) {
      long double sum = 0;
      for (Index b = 0; b < batch; ++b)
        for (Index l = 0; l < length; ++l) sum += static_cast<long double>(dy(b, l, o)) * x(b, l, i);
      g.dweight(o, i) = static_cast<T>(sum);
    }
    for (Index b = 0; b < batch; ++b)
      for (Index l = 0; l < length; ++l) bias_sum += dy(b, l, o);
    g.dbias(o) = static_cast<T>(bias_sum);
  }
  return g;
}

TYPED_TEST(ProjectionTest, LinearBackwardMatchesBruteForceOnContiguousAndStridedInputs) {
  using T = TypeParam;
  Random random(103);
  std::vector<LinearShape> shapes = linear_shapes();
  shapes.push_back({2, 300, 70, 130});  // several depth blocks of the dW product (L > 128) and column panels
  shapes.push_back({1, 257, 512, 64});
  std::size_t index = 0;
  for (const LinearShape& s : shapes) {
    SCOPED_TRACE(describe(s));
    // x a column block of a wider buffer with an uneven batch stride, W a column block too, dy contiguous.
    const Index rows = s.length + 1, width = s.in + 3;
    const Tensor<T, 3> buffer = random.normal_tensor<T, 3>({s.batch, rows, width});
    const TensorView<const T, 3> strided_x(buffer.data() + 1, {s.batch, s.length, s.in}, {rows * width, width, 1});
    const Tensor<T, 2> weight_buffer = random.normal_tensor<T, 2>({s.out, s.in + 2});
    const TensorView<const T, 2> strided_w(weight_buffer.data() + 2, {s.out, s.in}, {s.in + 2, 1});
    const Tensor<T, 3> dy = random.normal_tensor<T, 3>({s.batch, s.length, s.out});
    const Tensor<T, 3> x = random.normal_tensor<T, 3>({s.batch, s.length, s.in});
    const Tensor<T, 2> w = random.normal_tensor<T, 2>({s.out, s.in});
    for (const bool strided : {false, true}) {
      if (!test::sweep_case_runs(index++)) continue;  // a third of the cases under a sanitizer
      SCOPED_TRACE(strided ? "strided x and W" : "contiguous");
      const TensorView<const T, 3> xv = strided ? strided_x : TensorView<const T, 3>(x);
      const TensorView<const T, 2> wv = strided ? strided_w : TensorView<const T, 2>(w);
      const LinearGradients<T> g = linear_backward<T>(xv, wv, dy, true);
      const LinearGradients<T> expected = brute_force_linear_backward<T>(xv, wv, dy);
      EXPECT_TRUE(all_close(g.dx, expected.dx, default_tolerance<T>()));
      EXPECT_TRUE(all_close(g.dweight, expected.dweight, default_tolerance<T>()));
      EXPECT_TRUE(all_close(g.dbias, expected.dbias, default_tolerance<T>()));
    }
  }
}

TYPED_TEST(ProjectionTest, LinearWithStridedWeight) {
  using T = TypeParam;
  // The weight may itself be a row block of a stacked (3 * Out, In) in_proj_weight, or a column block.
  Random random(103);
  const Tensor<T, 3> x = random.normal_tensor<T, 3>({2, 4, 6});
  const Tensor<T, 2> stacked = random.normal_tensor<T, 2>({9, 10});
  const TensorView<const T, 2> block(stacked.data() + 3 * 10 + 2, {3, 6}, {10, 1});  // rows 3..5, cols 2..7
  const Tensor<T, 2> block_copy(block);
  const Tensor<T, 1> bias = random.normal_tensor<T, 1>(std::array<Index, 1>{3});
  EXPECT_TRUE(all_close(linear<T>(x, block, bias), brute_force_linear<T>(x, block_copy, bias), default_tolerance<T>()));
}

TYPED_TEST(ProjectionTest, LinearIntoAColumnBlockLeavesTheRestAlone) {
  using T = TypeParam;
  constexpr Index B = 3, L = 4, In = 5, Out = 6, Width = 3 * Out;
  Random random(104);
  const Tensor<T, 3> x = random.normal_tensor<T, 3>({B, L, In});
  const Tensor<T, 2> w = random.normal_tensor<T, 2>({Out, In});
  const Tensor<T, 1> bias = random.normal_tensor<T, 1>(std::array<Index, 1>{Out});
  Tensor<T, 3> wide({B, L, Width});
  wide.fill(T(-3));
  const TensorView<T, 3> middle(wide.data() + Out, {B, L, Out}, {L * Width, Width, 1});
  detail::linear_into<T>(x, w, bias, middle);
  EXPECT_TRUE(all_close(middle, brute_force_linear<T>(x, w, bias), default_tolerance<T>()));
  for (Index b = 0; b < B; ++b)
    for (Index l = 0; l < L; ++l)
      for (Index c = 0; c < Width; ++c)
        if (c < Out || c >= 2 * Out) {
          ASSERT_EQ(wide(b, l, c), T(-3)) << "at (" << b << ", " << l << ", " << c << ")";
        }
}

// Checks fused_qkv_projection(x, [Wq, Wk, Wv], [bq, bk, bv]) against three linear calls.
template <typename T>
void expect_fused_equals_separate(const TensorView<const T, 3>& x, const std::array<Tensor<T, 2>, 3>& weights,
                                  const std::array<Tensor<T, 1>, 3>& biases) {
  const Tensor<T, 3> fused = detail::fused_qkv_projection<T>(x, {weights[0].view(), weights[1].view(), weights[2].view()},
                                                             {biases[0].view(), biases[1].view(), biases[2].view()});
  const Index total = weights[0].dim(0) + weights[1].dim(0) + weights[2].dim(0);
  ASSERT_EQ(fused.shape(), (std::array<Index, 3>{x.dim(0), x.dim(1), total}));
  Index column = 0;
  const char* names[] = {"q", "k", "v"};
  for (std::size_t m = 0; m < 3; ++m) {
    SCOPED_TRACE(names[m]);
    const Index width = weights[m].dim(0);
    const TensorView<const T, 3> block(fused.data() + column, {x.dim(0), x.dim(1), width},
                                       {x.dim(1) * total, total, 1});
    const Tensor<T, 3> separate = linear<T>(x, weights[m], biases[m]);
    EXPECT_TRUE(all_close(block, separate, default_tolerance<T>()));
    EXPECT_TRUE(all_close(block, brute_force_linear<T>(x, weights[m], biases[m]), default_tolerance<T>()));
    column += width;
  }
}

struct QkvShape {
  Index batch, length, in, q_out, kv_out;
};

TYPED_TEST(ProjectionTest, FusedQkvEqualsThreeLinears) {
  using T = TypeParam;
  Random random(200);
  const std::vector<QkvShape> shapes{
      {2, 5, 8, 8, 8},     // multi-head: q, k, v all (E, E)
      {2, 5, 8, 8, 4},     // grouped-query: k, v narrower than q
      {1, 3, 12, 12, 3},   // multi-query: one kv head of width 3
      {3, 7, 9, 9, 9},     // odd sizes
      {1, 1, 1, 1, 1},     // everything 1
      {2, 6, 48, 48, 16},  // bigger
  };
  for (const QkvShape& s : shapes) {
    SCOPED_TRACE("B=" + std::to_string(s.batch) + " L=" + std::to_string(s.length) + " In=" + std::to_string(s.in) +
                 " q=" + std::to_string(s.q_out) + " kv=" + std::to_string(s.kv_out));
    const Tensor<T, 3> x = random.normal_tensor<T, 3>({s.batch, s.length, s.in});
    const std::array<Tensor<T, 2>, 3> weights{random.normal_tensor<T, 2>({s.q_out, s.in}),
                                              random.normal_tensor<T, 2>({s.kv_out, s.in}),
                                              random.normal_tensor<T, 2>({s.kv_out, s.in})};
    const std::array<Tensor<T, 1>, 3> biases{random.normal_tensor<T, 1>(std::array<Index, 1>{s.q_out}),
                                             random.normal_tensor<T, 1>(std::array<Index, 1>{s.kv_out}),
                                             random.normal_tensor<T, 1>(std::array<Index, 1>{s.kv_out})};
    {
      SCOPED_TRACE("with biases");
      expect_fused_equals_separate<T>(x, weights, biases);
    }
    {
      SCOPED_TRACE("without biases");
      expect_fused_equals_separate<T>(x, weights, {});
    }
    {
      // Biases of a module built without them, after a copy or an explicit reset to size 0: absent.
      SCOPED_TRACE("empty biases");
      const std::array<Tensor<T, 1>, 3> empty{Tensor<T, 1>(std::array<Index, 1>{0}), Tensor<T, 1>(std::array<Index, 1>{0}),
                                              Tensor<T, 1>(std::array<Index, 1>{0})};
      expect_fused_equals_separate<T>(x, weights, empty);
    }
    {
      SCOPED_TRACE("strided x (per-batch GEMMs)");
      const Tensor<T, 3> buffer = random.normal_tensor<T, 3>({s.batch, s.length + 1, s.in + 2});
      const TensorView<const T, 3> strided(buffer.data() + 1, {s.batch, s.length, s.in},
                                           {(s.length + 1) * (s.in + 2), s.in + 2, 1});
      expect_fused_equals_separate<T>(strided, weights, biases);
    }
  }
}

TYPED_TEST(ProjectionTest, FusedQkvBlocksAreInQkvOrder) {
  using T = TypeParam;
  // Weights that pick out single input columns make the block order visible exactly.
  constexpr Index B = 2, L = 3, In = 4;
  Random random(201);
  const Tensor<T, 3> x = random.normal_tensor<T, 3>({B, L, In});
  std::array<Tensor<T, 2>, 3> weights{Tensor<T, 2>({2, In}), Tensor<T, 2>({1, In}), Tensor<T, 2>({1, In})};
  weights[0](0, 0) = T(1);  // q0 = x0
  weights[0](1, 1) = T(1);  // q1 = x1
  weights[1](0, 2) = T(1);  // k0 = x2
  weights[2](0, 3) = T(1);  // v0 = x3
  std::array<Tensor<T, 1>, 3> biases{Tensor<T, 1>(std::array<Index, 1>{2}), Tensor<T, 1>(std::array<Index, 1>{1}),
                                     Tensor<T, 1>(std::array<Index, 1>{1})};
  biases[0](1) = T(10);
  biases[1](0) = T(20);
  biases[2](0) = T(30);
  const Tensor<T, 3> y = detail::fused_qkv_projection<T>(x, {weights[0].view(), weights[1].view(), weights[2].view()},
                                                         {biases[0].view(), biases[1].view(), biases[2].view()});
  ASSERT_EQ(y.shape(), (std::array<Index, 3>{B, L, 4}));
  for (Index b = 0; b < B; ++b)
    for (Index l = 0; l < L; ++l) {
      EXPECT_EQ(y(b, l, 0), x(b, l, 0));
      EXPECT_EQ(y(b, l, 1), x(b, l, 1) + T(10));
      EXPECT_EQ(y(b, l, 2), x(b, l, 2) + T(20));
      EXPECT_EQ(y(b, l, 3), x(b, l, 3) + T(30));
    }
}

TYPED_TEST(ProjectionTest, WeightOfTheWrongInWidthThrows) {
  using T = TypeParam;
  const Tensor<T, 3> x({2, 3, 4});
  const Tensor<T, 2> w({3, 5});
  // "[linear] weight: expected shape (*, 4), got (3, 5)": any Out, In = 4.
  expect_error<ShapeError>([&] { (void)linear<T>(x, w); }, {"[linear]", "weight", "(*, 4)", "(3, 5)"});
  const Tensor<T, 2> narrow({7, 1});
  expect_error<ShapeError>([&] { (void)linear<T>(x, narrow); }, {"weight", "(*, 4)", "(7, 1)"});
}

TYPED_TEST(ProjectionTest, BiasOfTheWrongLengthThrows) {
  using T = TypeParam;
  const Tensor<T, 3> x({2, 3, 4});
  const Tensor<T, 2> w({3, 4});
  for (const Index length : {Index{1}, Index{2}, Index{4}}) {
    SCOPED_TRACE("bias length " + std::to_string(length));
    const Tensor<T, 1> bias(std::array<Index, 1>{length});
    expect_error<ShapeError>([&] { (void)linear<T>(x, w, bias); },
                             {"[linear]", "bias", "(3)", "(" + std::to_string(length) + ")"});
  }
  const Tensor<T, 1> bias_of_three({3});
  EXPECT_NO_THROW((void)linear<T>(x, w, bias_of_three));
}

}  // namespace
}  // namespace selfattn::test
