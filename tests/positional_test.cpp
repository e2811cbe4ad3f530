// Tests of selfattn/positional.hpp: sinusoidal_encoding, alibi_slopes, RotaryEmbedding.
//
// References here are written from the formulas, not from the header: the sinusoidal values and the RoPE
// reference are computed in long double (RoPE through complex multiplication rather than a rotation), and
// the ALiBi slopes for non-power-of-two head counts are worked out by hand in the comments.
#include <selfattn/positional.hpp>

#include "support/scalars.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <complex>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace {

using selfattn::Index;
using selfattn::RopeStyle;
using selfattn::RotaryEmbedding;
using selfattn::ShapeError;
using selfattn::Tensor;
using selfattn::TensorView;

// ---- helpers -------------------------------------------------------------------------------------

template <typename T>
struct Tol;
template <>
struct Tol<float> {
  static constexpr double value = 2e-6;    // a few float ulps at magnitude ~1
  static constexpr double inverse = 1e-5;  // apply then apply_inverse
  static constexpr double score = 1e-4;    // relative, dot products of rotated vectors
};
template <>
struct Tol<double> {
  static constexpr double value = 1e-12;
  static constexpr double inverse = 1e-12;
  static constexpr double score = 1e-12;
};

template <typename T>
Tensor<T, 4> random_tensor(const std::array<Index, 4>& shape, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> dist(-1.0, 1.0);
  Tensor<T, 4> x(shape);
  for (Index n = 0; n < x.size(); ++n) x.data()[n] = static_cast<T>(dist(rng));
  return x;
}

template <typename T>
std::vector<T> random_vector(Index n, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> dist(-1.0, 1.0);
  std::vector<T> v(static_cast<std::size_t>(n));
  for (T& e : v) e = static_cast<T>(dist(rng));
  return v;
}

// Runs `body`, expects exception type Ex whose message names `argument`.
template <typename Ex>
void expect_throw_naming(const std::function<void()>& body, const std::string& argument) {
  try {
    body();
    ADD_FAILURE() << "expected an exception naming " << argument;
  } catch (const Ex& e) {
    EXPECT_NE(std::string(e.what()).find(argument), std::string::npos) << "message: " << e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong exception type, message: " << e.what();
  }
}

// Brute-force RoPE of one row, written from the definition: each pair (a, b) is the complex number
// a + i b multiplied by e^{i * position * theta_j}, theta_j = base^(-2j/dim), all in long double.
template <typename T>
std::vector<long double> rope_reference(const std::vector<T>& row, Index dim, long double base, RopeStyle style,
                                        long double position) {
  std::vector<long double> out(row.begin(), row.end());
  for (Index j = 0; j < dim / 2; ++j) {
    const Index re = style == RopeStyle::half ? j : 2 * j;
    const Index im = style == RopeStyle::half ? j + dim / 2 : 2 * j + 1;
    const long double theta = std::pow(base, -2.0L * static_cast<long double>(j) / static_cast<long double>(dim));
    const std::complex<long double> z(out[static_cast<std::size_t>(re)], out[static_cast<std::size_t>(im)]);
    const std::complex<long double> w = z * std::polar(1.0L, position * theta);
    out[static_cast<std::size_t>(re)] = w.real();
    out[static_cast<std::size_t>(im)] = w.imag();
  }
  return out;
}

template <typename T>
std::vector<T> row_of(const Tensor<T, 4>& x, Index b, Index h, Index l) {
  std::vector<T> row(static_cast<std::size_t>(x.dim(3)));
  for (Index d = 0; d < x.dim(3); ++d) row[static_cast<std::size_t>(d)] = x(b, h, l, d);
  return row;
}

// One vector as a (1, 1, 1, D) tensor rotated at `position`.
template <typename T>
std::vector<T> rotated(const RotaryEmbedding<T>& rope, const std::vector<T>& v, Index position) {
  Tensor<T, 4> x({1, 1, 1, static_cast<Index>(v.size())});
  std::copy(v.begin(), v.end(), x.data());
  rope.apply(x, position);
  return std::vector<T>(x.data(), x.data() + x.size());
}

template <typename T>
long double dot(const std::vector<T>& a, const std::vector<T>& b) {
  long double s = 0;
  for (std::size_t n = 0; n < a.size(); ++n) s += static_cast<long double>(a[n]) * static_cast<long double>(b[n]);
  return s;
}

SELFATTN_SCALAR_TEST_SUITE(PositionalTest);

const RopeStyle kStyles[] = {RopeStyle::half, RopeStyle::interleaved};

// ---- sinusoidal_encoding -------------------------------------------------------------------------

TYPED_TEST(PositionalTest, SinusoidalShapeAndFirstRow) {
  using T = TypeParam;
  const Tensor<T, 2> pe = selfattn::sinusoidal_encoding<T>(7, 12);
  EXPECT_EQ(pe.dim(0), 7);
  EXPECT_EQ(pe.dim(1), 12);
  // Position 0: every angle is 0, so sin = 0 and cos = 1 exactly.
  for (Index d = 0; d < 12; ++d) EXPECT_EQ(pe(0, d), d % 2 == 0 ? T(0) : T(1)) << "d = " << d;
}

TYPED_TEST(PositionalTest, SinusoidalMatchesFormula) {
  using T = TypeParam;
  const Index length = 513, embed_dim = 64;
  const Tensor<T, 2> pe = selfattn::sinusoidal_encoding<T>(length, embed_dim);
  for (Index p : {1, 2, 17, 100, 512}) {
    for (Index i : {0, 1, 5, 16, 31}) {
      // pe[p, 2i] = sin(p / 10000^(2i/E)), pe[p, 2i+1] = cos(same), in long double.
      const long double angle =
          static_cast<long double>(p) / std::pow(10000.0L, static_cast<long double>(2 * i) / embed_dim);
      EXPECT_NEAR(pe(p, 2 * i), static_cast<double>(std::sin(angle)), Tol<T>::value) << "p = " << p << ", i = " << i;
      EXPECT_NEAR(pe(p, 2 * i + 1), static_cast<double>(std::cos(angle)), Tol<T>::value) << "p = " << p << ", i = " << i;
    }
  }
  // Spot value by hand: E = 2 has one frequency, 10000^0 = 1, so pe[p] = (sin p, cos p).
  const Tensor<T, 2> pe2 = selfattn::sinusoidal_encoding<T>(4, 2);
  EXPECT_NEAR(pe2(3, 0), 0.14112000805986721, Tol<T>::value);   // sin 3
  EXPECT_NEAR(pe2(3, 1), -0.98999249660044542, Tol<T>::value);  // cos 3
}

TEST(Sinusoidal, EmptyLengthAndErrors) {
  const Tensor<double, 2> empty = selfattn::sinusoidal_encoding<double>(0, 8);
  EXPECT_EQ(empty.dim(0), 0);
  EXPECT_EQ(empty.dim(1), 8);
  EXPECT_EQ(empty.size(), 0);
  expect_throw_naming<std::invalid_argument>([] { selfattn::sinusoidal_encoding<float>(4, 7); }, "embed_dim");
  expect_throw_naming<std::invalid_argument>([] { selfattn::sinusoidal_encoding<float>(4, 0); }, "embed_dim");
  expect_throw_naming<std::invalid_argument>([] { selfattn::sinusoidal_encoding<float>(4, -2); }, "embed_dim");
  expect_throw_naming<std::invalid_argument>([] { selfattn::sinusoidal_encoding<float>(-1, 8); }, "length");
}

// ---- alibi_slopes --------------------------------------------------------------------------------

TYPED_TEST(PositionalTest, AlibiPowerOfTwo) {
  using T = TypeParam;
  const std::vector<T> s8 = selfattn::alibi_slopes<T>(8);
  ASSERT_EQ(s8.size(), 8u);
  for (int h = 0; h < 8; ++h) EXPECT_EQ(s8[static_cast<std::size_t>(h)], T(std::ldexp(1.0, -(h + 1)))) << "h = " << h;

  const std::vector<T> s1 = selfattn::alibi_slopes<T>(1);  // 2^(-8 * 1 / 1)
  ASSERT_EQ(s1.size(), 1u);
  EXPECT_EQ(s1[0], T(1.0 / 256.0));

  const std::vector<T> s16 = selfattn::alibi_slopes<T>(16);  // 2^(-h/2), h = 1..16
  ASSERT_EQ(s16.size(), 16u);
  EXPECT_NEAR(s16[0], 0.70710678118654752, Tol<T>::value);
  EXPECT_EQ(s16[1], T(0.5));
  EXPECT_EQ(s16[15], T(1.0 / 256.0));
}

TYPED_TEST(PositionalTest, AlibiNonPowerOfTwo) {
  using T = TypeParam;
  // Worked out by hand from the paper's rule (n = largest power of two below H: the n-head slopes,
  // then the 2n-head slopes at indices 0, 2, 4, ...). Checked against get_slopes in
  // ofirpress/attention_with_linear_biases (fairseq/models/transformer.py).
  const double r = 0.70710678118654752;  // 2^-0.5
  struct Case {
    Index heads;
    std::vector<double> slopes;
  };
  const std::vector<Case> cases = {
      // n = 2: 2^-4, 2^-8; 4-head slopes 2^-2, 2^-4, 2^-6, 2^-8 -> index 0: 2^-2.
      {3, {1.0 / 16, 1.0 / 256, 1.0 / 4}},
      // n = 4: 2^-2, 2^-4, 2^-6, 2^-8; 8-head slopes 2^-1 .. 2^-8 -> index 0: 2^-1.
      {5, {1.0 / 4, 1.0 / 16, 1.0 / 64, 1.0 / 256, 1.0 / 2}},
      // n = 4, then 8-head indices 0, 2: 2^-1, 2^-3.
      {6, {1.0 / 4, 1.0 / 16, 1.0 / 64, 1.0 / 256, 1.0 / 2, 1.0 / 8}},
      // n = 8: 2^-1 .. 2^-8; 16-head slopes 2^(-k/2), k = 1..16 -> indices 0, 2, 4, 6: k = 1, 3, 5, 7.
      {12, {1.0 / 2, 1.0 / 4, 1.0 / 8, 1.0 / 16, 1.0 / 32, 1.0 / 64, 1.0 / 128, 1.0 / 256, r, r / 2, r / 4, r / 8}},
  };
  for (const Case& c : cases) {
    const std::vector<T> s = selfattn::alibi_slopes<T>(c.heads);
    ASSERT_EQ(s.size(), static_cast<std::size_t>(c.heads));
    for (std::size_t h = 0; h < s.size(); ++h)
      EXPECT_NEAR(s[h], c.slopes[h], Tol<T>::value * c.slopes[h]) << "H = " << c.heads << ", h = " << h;
  }
}

TEST(Alibi, SizeAndErrors) {
  for (Index heads = 1; heads <= 40; ++heads) {
    const std::vector<double> s = selfattn::alibi_slopes<double>(heads);
    ASSERT_EQ(s.size(), static_cast<std::size_t>(heads));
    for (double slope : s) {
      EXPECT_GT(slope, 0.0);
      EXPECT_LT(slope, 1.0);
    }
  }
  expect_throw_naming<std::invalid_argument>([] { selfattn::alibi_slopes<float>(0); }, "num_heads");
  expect_throw_naming<std::invalid_argument>([] { selfattn::alibi_slopes<float>(-3); }, "num_heads");
}

// ---- RotaryEmbedding -----------------------------------------------------------------------------

TYPED_TEST(PositionalTest, RopeAccessors) {
  using T = TypeParam;
  const RotaryEmbedding<T> rope(8, T(500), RopeStyle::interleaved);
  EXPECT_EQ(rope.dim(), 8);
  EXPECT_EQ(rope.base(), T(500));
  EXPECT_EQ(rope.style(), RopeStyle::interleaved);
  const RotaryEmbedding<T> defaults(4);
  EXPECT_EQ(defaults.base(), T(10000));
  EXPECT_EQ(defaults.style(), RopeStyle::half);
}

TYPED_TEST(PositionalTest, RopeMatchesBruteForce) {
  using T = TypeParam;
  const Index B = 2, H = 3, L = 5, D = 12;
  for (RopeStyle style : kStyles) {
    for (Index offset : {Index(0), Index(7), Index(-4)}) {
      const RotaryEmbedding<T> rope(D, T(100), style);
      const Tensor<T, 4> input = random_tensor<T>({B, H, L, D}, 11);
      Tensor<T, 4> x = input;
      rope.apply(x, offset);
      for (Index b = 0; b < B; ++b)
        for (Index h = 0; h < H; ++h)
          for (Index l = 0; l < L; ++l) {
            const std::vector<long double> want =
                rope_reference(row_of(input, b, h, l), D, 100.0L, style, static_cast<long double>(offset + l));
            for (Index d = 0; d < D; ++d)
              EXPECT_NEAR(x(b, h, l, d), static_cast<double>(want[static_cast<std::size_t>(d)]), Tol<T>::value)
                  << "style " << static_cast<int>(style) << ", offset " << offset << ", (" << b << ", " << h << ", "
                  << l << ", " << d << ")";
          }
    }
  }
}

TYPED_TEST(PositionalTest, RopeAccurateAtLongPositions) {
  // cos / sin come from a double angle, so float stays within a few ulps even at position 10^5 (a float
  // angle would be off by ~4e-3 rad there).
  using T = TypeParam;
  const Index D = 16;
  for (RopeStyle style : kStyles) {
    const RotaryEmbedding<T> rope(D, T(10000), style);
    const Tensor<T, 4> input = random_tensor<T>({1, 2, 3, D}, 5);
    Tensor<T, 4> x = input;
    const Index offset = 100000;
    rope.apply(x, offset);
    for (Index h = 0; h < 2; ++h)
      for (Index l = 0; l < 3; ++l) {
        const std::vector<long double> want =
            rope_reference(row_of(input, 0, h, l), D, 10000.0L, style, static_cast<long double>(offset + l));
        const double tolerance = std::is_same_v<T, float> ? 1e-6 : 1e-10;
        for (Index d = 0; d < D; ++d)
          EXPECT_NEAR(x(0, h, l, d), static_cast<double>(want[static_cast<std::size_t>(d)]), tolerance);
      }
  }
}

TYPED_TEST(PositionalTest, RopePartialRotaryLeavesTailUntouched) {
  using T = TypeParam;
  const Index B = 2, H = 2, L = 4, D = 10, dim = 6;
  for (RopeStyle style : kStyles) {
    const RotaryEmbedding<T> rope(dim, T(10000), style);
    const Tensor<T, 4> input = random_tensor<T>({B, H, L, D}, 21);
    Tensor<T, 4> x = input;
    rope.apply(x, 3);
    for (Index b = 0; b < B; ++b)
      for (Index h = 0; h < H; ++h)
        for (Index l = 0; l < L; ++l) {
          // Head part: as a dim-wide rotation of the first dim entries.
          std::vector<T> head = row_of(input, b, h, l);
          head.resize(static_cast<std::size_t>(dim));
          const std::vector<long double> want = rope_reference(head, dim, 10000.0L, style, 3.0L + l);
          for (Index d = 0; d < dim; ++d)
            EXPECT_NEAR(x(b, h, l, d), static_cast<double>(want[static_cast<std::size_t>(d)]), Tol<T>::value);
          // Tail: bit for bit the input.
          for (Index d = dim; d < D; ++d) EXPECT_EQ(x(b, h, l, d), input(b, h, l, d));
        }
  }
}

TYPED_TEST(PositionalTest, RopePreservesPairNorms) {
  using T = TypeParam;
  const Index D = 16, half = D / 2;
  for (RopeStyle style : kStyles) {
    const RotaryEmbedding<T> rope(D, T(10000), style);
    const Tensor<T, 4> input = random_tensor<T>({2, 2, 9, D}, 31);
    Tensor<T, 4> x = input;
    rope.apply(x, 250);
    for (Index b = 0; b < 2; ++b)
      for (Index h = 0; h < 2; ++h)
        for (Index l = 0; l < 9; ++l)
          for (Index j = 0; j < half; ++j) {
            const Index p = style == RopeStyle::half ? j : 2 * j;
            const Index q = style == RopeStyle::half ? j + half : 2 * j + 1;
            const double before = std::hypot(double(input(b, h, l, p)), double(input(b, h, l, q)));
            const double after = std::hypot(double(x(b, h, l, p)), double(x(b, h, l, q)));
            EXPECT_NEAR(after, before, Tol<T>::value);
          }
  }
}

TYPED_TEST(PositionalTest, RopeInverseUndoesApply) {
  using T = TypeParam;
  for (RopeStyle style : kStyles) {
    const RotaryEmbedding<T> rope(8, T(10000), style);
    const Tensor<T, 4> input = random_tensor<T>({2, 3, 6, 10}, 41);
    Tensor<T, 4> x = input;
    rope.apply(x, 1000);
    // It must actually have moved, or this test would prove nothing.
    double moved = 0;
    for (Index n = 0; n < x.size(); ++n) moved = std::max(moved, std::abs(double(x.data()[n]) - input.data()[n]));
    EXPECT_GT(moved, 0.1);
    rope.apply_inverse(x, 1000);
    for (Index n = 0; n < x.size(); ++n) EXPECT_NEAR(x.data()[n], input.data()[n], Tol<T>::inverse) << "n = " << n;

    // And the other way round.
    Tensor<T, 4> y = input;
    rope.apply_inverse(y, 37);
    rope.apply(y, 37);
    for (Index n = 0; n < y.size(); ++n) EXPECT_NEAR(y.data()[n], input.data()[n], Tol<T>::inverse);

    // For a single row (L = 1) the inverse at position t is the rotation at position -t.
    const Tensor<T, 4> one_row = random_tensor<T>({2, 3, 1, 10}, 42);
    Tensor<T, 4> inverse = one_row, negative = one_row;
    rope.apply_inverse(inverse, 37);
    rope.apply(negative, -37);
    for (Index n = 0; n < one_row.size(); ++n) EXPECT_NEAR(inverse.data()[n], negative.data()[n], Tol<T>::value);
  }
}

TYPED_TEST(PositionalTest, RopeOffsetEqualsPrefixedRows) {
  // Applying at offset t is applying at 0 to a sequence whose rows are preceded by t others, then keeping
  // the tail. Positions are integers, exact in double, so both paths use the same angle: bitwise equal.
  using T = TypeParam;
  const Index B = 2, H = 2, L = 5, D = 8, t = 13;
  for (RopeStyle style : kStyles) {
    const RotaryEmbedding<T> rope(D, T(10000), style);
    Tensor<T, 4> x = random_tensor<T>({B, H, L, D}, 51);
    Tensor<T, 4> longer = random_tensor<T>({B, H, t + L, D}, 52);
    for (Index b = 0; b < B; ++b)
      for (Index h = 0; h < H; ++h)
        for (Index l = 0; l < L; ++l)
          for (Index d = 0; d < D; ++d) longer(b, h, t + l, d) = x(b, h, l, d);
    rope.apply(x, t);
    rope.apply(longer, 0);
    for (Index b = 0; b < B; ++b)
      for (Index h = 0; h < H; ++h)
        for (Index l = 0; l < L; ++l)
          for (Index d = 0; d < D; ++d) EXPECT_EQ(x(b, h, l, d), longer(b, h, t + l, d));
  }
}

TYPED_TEST(PositionalTest, RopeScoreDependsOnlyOnRelativePosition) {
  // rope(q, m) . rope(k, n) = q^T R(m)^T R(n) k = q^T R(n - m) k: shifting both positions by t leaves the
  // score unchanged. This is the property RoPE exists for.
  using T = TypeParam;
  const Index D = 32, t = 37;
  std::mt19937_64 rng(61);
  for (RopeStyle style : kStyles) {
    const RotaryEmbedding<T> rope(D, T(10000), style);
    const std::pair<Index, Index> positions[] = {{0, 0}, {5, 2}, {2, 5}, {100, 250}, {1000, 999}};
    for (const auto& [m, n] : positions) {
      const std::vector<T> q = random_vector<T>(D, rng);
      const std::vector<T> k = random_vector<T>(D, rng);
      const long double score = dot(rotated(rope, q, m), rotated(rope, k, n));
      const long double shifted = dot(rotated(rope, q, m + t), rotated(rope, k, n + t));
      const double scale = std::sqrt(static_cast<double>(dot(q, q) * dot(k, k)));  // |q| |k| bounds the score
      EXPECT_NEAR(static_cast<double>(shifted), static_cast<double>(score), Tol<T>::score * scale)
          << "m = " << m << ", n = " << n;
      // And it is really position-dependent: rotating k alone by a different position changes the score.
      if (m != n) {
        const long double unrotated = dot(q, k);
        EXPECT_GT(std::abs(static_cast<double>(score - unrotated)), 1e-3) << "m = " << m << ", n = " << n;
      }
    }
  }
}

TYPED_TEST(PositionalTest, RopeStridedViewMatchesContiguous) {
  // A head-split view: memory laid out (B, L, H, D) viewed as (B, H, L, D) with strides, as split_heads
  // produces it; rotating through the view must equal rotating a contiguous copy.
  using T = TypeParam;
  const Index B = 2, H = 3, L = 4, D = 8;
  for (RopeStyle style : kStyles) {
    const RotaryEmbedding<T> rope(6, T(10000), style);
    Tensor<T, 4> blhd = random_tensor<T>({B, L, H, D}, 71);
    TensorView<T, 4> bhld(blhd.data(), {B, H, L, D}, {L * H * D, D, H * D, 1});
    Tensor<T, 4> contiguous{TensorView<const T, 4>(bhld)};
    rope.apply(bhld, 9);
    rope.apply(contiguous.view(), 9);
    for (Index b = 0; b < B; ++b)
      for (Index h = 0; h < H; ++h)
        for (Index l = 0; l < L; ++l)
          for (Index d = 0; d < D; ++d) {
            EXPECT_EQ(bhld(b, h, l, d), contiguous(b, h, l, d));
            EXPECT_EQ(blhd(b, l, h, d), contiguous(b, h, l, d));
          }
  }
}

TYPED_TEST(PositionalTest, RopePerBatchOffsetsEqualSeparateCalls) {
  using T = TypeParam;
  const Index B = 3, H = 2, L = 4, D = 8;
  const std::vector<Index> offsets = {0, 17, -2};
  for (RopeStyle style : kStyles) {
    const RotaryEmbedding<T> rope(D, T(10000), style);
    const Tensor<T, 4> input = random_tensor<T>({B, H, L, D}, 81);
    Tensor<T, 4> together = input;
    Tensor<T, 4> separate = input;
    rope.apply(together, offsets);
    for (Index b = 0; b < B; ++b) {
      TensorView<T, 4> one(separate.data() + b * H * L * D, {1, H, L, D});
      rope.apply(one, offsets[static_cast<std::size_t>(b)]);
    }
    for (Index n = 0; n < input.size(); ++n) EXPECT_EQ(together.data()[n], separate.data()[n]) << "n = " << n;

    // The same for the inverse, which also undoes the per-batch apply.
    Tensor<T, 4> separate_back = together;
    rope.apply_inverse(together, offsets);
    for (Index b = 0; b < B; ++b) {
      TensorView<T, 4> one(separate_back.data() + b * H * L * D, {1, H, L, D});
      rope.apply_inverse(one, offsets[static_cast<std::size_t>(b)]);
    }
    for (Index n = 0; n < input.size(); ++n) {
      EXPECT_EQ(together.data()[n], separate_back.data()[n]);
      EXPECT_NEAR(together.data()[n], input.data()[n], Tol<T>::inverse);
    }
  }
}

TYPED_TEST(PositionalTest, RopeCallForms) {
  // Tensor, tensor.view() and a strided view all bind to apply / apply_inverse, with or without an offset.
  using T = TypeParam;
  const RotaryEmbedding<T> rope(4);
  const Tensor<T, 4> input = random_tensor<T>({1, 2, 3, 4}, 91);
  Tensor<T, 4> a = input, b = input, c = input;
  rope.apply(a, 3);
  rope.apply(b.view(), 3);
  TensorView<T, 4> strided(c.data(), {1, 2, 3, 4}, {24, 12, 4, 1});
  rope.apply(strided, 3);
  for (Index n = 0; n < input.size(); ++n) {
    EXPECT_EQ(a.data()[n], b.data()[n]);
    EXPECT_EQ(a.data()[n], c.data()[n]);
  }
  rope.apply(a);  // default offset 0
  rope.apply_inverse(a);
  rope.apply_inverse(a, 3);
  rope.apply_inverse(b.view(), 3);
  rope.apply_inverse(strided, 3);
  for (Index n = 0; n < input.size(); ++n) {
    EXPECT_NEAR(a.data()[n], input.data()[n], Tol<T>::inverse);
    EXPECT_EQ(b.data()[n], c.data()[n]);
  }
  // Empty tensors are fine.
  Tensor<T, 4> empty({0, 2, 3, 4});
  rope.apply(empty, 5);
  rope.apply(empty, std::vector<Index>{});
}

TYPED_TEST(PositionalTest, RopeErrors) {
  using T = TypeParam;
  expect_throw_naming<std::invalid_argument>([] { RotaryEmbedding<T> rope(7); }, "dim");
  expect_throw_naming<std::invalid_argument>([] { RotaryEmbedding<T> rope(0); }, "dim");
  expect_throw_naming<std::invalid_argument>([] { RotaryEmbedding<T> rope(-2); }, "dim");
  expect_throw_naming<std::invalid_argument>([] { RotaryEmbedding<T> rope(8, T(0)); }, "base");
  expect_throw_naming<std::invalid_argument>([] { RotaryEmbedding<T> rope(8, T(-10)); }, "base");
  expect_throw_naming<std::invalid_argument>(
      [] { RotaryEmbedding<T> rope(8, std::numeric_limits<T>::infinity()); }, "base");
  expect_throw_naming<std::invalid_argument>(
      [] { RotaryEmbedding<T> rope(8, std::numeric_limits<T>::quiet_NaN()); }, "base");

  const RotaryEmbedding<T> rope(8);
  const Tensor<T, 4> input = random_tensor<T>({2, 1, 3, 6}, 101);
  Tensor<T, 4> x = input;
  // dim 8 > D 6: a ShapeError naming x with expected and actual shapes.
  try {
    rope.apply(x, 0);
    ADD_FAILURE() << "expected ShapeError";
  } catch (const ShapeError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("[RotaryEmbedding::apply] x: expected shape (*, *, *, D) with D >= dim = 8"),
              std::string::npos)
        << message;
    EXPECT_NE(message.find("got (2, 1, 3, 6)"), std::string::npos) << message;
  }
  expect_throw_naming<ShapeError>([&] { rope.apply_inverse(x, 0); }, "x");
  expect_throw_naming<ShapeError>([&] { rope.apply(x, std::vector<Index>{0, 0}); }, "x");

  Tensor<T, 4> y = random_tensor<T>({2, 1, 3, 8}, 102);
  const Tensor<T, 4> y_before = y;
  expect_throw_naming<ShapeError>([&] { rope.apply(y, std::vector<Index>{1}); }, "position_offsets");
  expect_throw_naming<ShapeError>([&] { rope.apply(y, std::vector<Index>{1, 2, 3}); }, "position_offsets");
  expect_throw_naming<ShapeError>([&] { rope.apply_inverse(y, std::vector<Index>{1}); }, "position_offsets");
  // Nothing is written on error.
  for (Index n = 0; n < x.size(); ++n) EXPECT_EQ(x.data()[n], input.data()[n]);
  for (Index n = 0; n < y.size(); ++n) EXPECT_EQ(y.data()[n], y_before.data()[n]);
}

}  // namespace
