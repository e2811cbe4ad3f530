// Tests of mask.hpp: the key range of the structural masks and the per-element terms, checked against
// the definitions in API.md one mask at a time; and masks and biases of rank 2 and 3 (MaskView) on every kernel.
#include <selfattn/attention.hpp>
#include <selfattn/detail/mask.hpp>

#include "support/brute_force.hpp"
#include "support/compare.hpp"
#include "support/expect_error.hpp"
#include "support/random.hpp"
#include "support/scalars.hpp"

#include <gtest/gtest.h>

#include <deque>
#include <limits>
#include <string>
#include <vector>

namespace selfattn::test {
namespace {

using detail::KeyRange;
using detail::MaskParams;

// Every (Lq, Lk, causal, window, key length) combination: the key range holds exactly the keys that the
// brute-force definition allows.
TEST(MaskTest, KeyRangeIsExactlyTheStructurallyAllowedKeys) {
  int checked = 0;
  for (Index q_len : {1, 3, 6})
    for (Index k_len : {0, 1, 4, 6, 9})
      for (Causal causal : {Causal::none, Causal::top_left, Causal::bottom_right})
        for (Index left : {-1, 0, 2})
          for (Index right : {-1, 0, 1})
            for (Index length = 0; length <= k_len; length += 2) {
              MaskParams<double> m;
              m.q_len = q_len;
              m.k_len = k_len;
              m.causal = causal;
              m.window_left = left;
              m.window_right = right;
              const std::vector<Index> lengths = {length};
              m.key_lengths = lengths.data();
              AttentionOptions<double> opts;
              opts.causal = causal;
              opts.window_left = left;
              opts.window_right = right;
              opts.key_lengths = lengths;
              for (Index i = 0; i < q_len; ++i) {
                const KeyRange range = m.key_range(0, i);
                ASSERT_LE(0, range.begin);
                ASSERT_LE(range.end, k_len);
                for (Index j = 0; j < k_len; ++j) {
                  const bool in_range = j >= range.begin && j < range.end;
                  EXPECT_EQ(in_range, test::brute_force_allowed(opts, 0, 0, i, j, q_len, k_len))
                      << "Lq " << q_len << " Lk " << k_len << " causal " << static_cast<int>(causal) << " window ("
                      << left << ", " << right << ") length " << length << " at (" << i << ", " << j << ")";
                }
                ++checked;
              }
            }
  EXPECT_GT(checked, 1000);
}

TEST(MaskTest, EmptyRangeWhenNothingIsVisible) {
  MaskParams<float> m;
  m.q_len = 5;
  m.k_len = 2;
  m.causal = Causal::bottom_right;  // off = -3: rows 0..2 see nothing
  EXPECT_TRUE(m.key_range(0, 0).empty());
  EXPECT_TRUE(m.key_range(0, 2).empty());
  EXPECT_FALSE(m.key_range(0, 3).empty());
  EXPECT_EQ(m.key_range(0, 4).end, 2);
}

TEST(MaskTest, BroadcastReadsRepeatExtentOneDimensions) {
  Tensor<double, 4> bias({1, 3, 1, 4});
  for (Index h = 0; h < 3; ++h)
    for (Index j = 0; j < 4; ++j) bias(0, h, 0, j) = 10.0 * h + j;
  const detail::Broadcast4<double> b(bias.view());
  ASSERT_TRUE(b.present());
  EXPECT_EQ(b(5, 2, 7, 3), 23.0);
  EXPECT_EQ(b(0, 1, 0, 0), 10.0);
  EXPECT_FALSE(detail::Broadcast4<double>().present());
}

TEST(MaskTest, ScoreAddsBiasAndSubtractsAlibiDistance) {
  Tensor<double, 4> bias({1, 1, 1, 1});
  bias(0, 0, 0, 0) = 0.5;
  const std::vector<double> slopes = {0.25, 0.125};
  MaskParams<double> m;
  m.q_len = 2;
  m.k_len = 5;  // off = 3
  m.bias = detail::Broadcast4<double>(bias.view());
  m.alibi_slopes = slopes.data();
  ASSERT_TRUE(m.has_element_masks());
  ASSERT_TRUE(m.has_alibi());
  // s + bias - slope_h * |i + off - j|: i = 1, j = 0 -> distance 4
  EXPECT_DOUBLE_EQ(m.score(m.row(0, 0, 1), 0, 0, 1, 0, 0.0), 0.5 - 0.25 * 4);
  EXPECT_DOUBLE_EQ(m.score(m.row(0, 1, 1), 0, 1, 1, 4, 0.0), 0.5);  // on the diagonal
  EXPECT_DOUBLE_EQ(m.score(m.row(0, 1, 0), 0, 1, 0, 4, 0.0), 0.5 - 0.125 * 1);
  EXPECT_DOUBLE_EQ(m.score(m.row(0, 1, 0), 0, 1, 0, 4, 2.0), 2.0 + 0.5 - 0.125 * 1) << "added to the score";
  EXPECT_FALSE(MaskParams<double>().has_element_masks());
  EXPECT_FALSE(MaskParams<double>().has_alibi());
}

TEST(MaskTest, RowDescribesRangeSlopeAndDiagonal) {
  const std::vector<float> slopes = {0.5f, 0.25f};
  MaskParams<float> m;
  m.q_len = 2;
  m.k_len = 5;  // off = 3
  m.causal = Causal::bottom_right;
  m.alibi_slopes = slopes.data();
  const detail::RowMask<float> row = m.row(0, 1, 0);
  EXPECT_EQ(row.keys.begin, 0);
  EXPECT_EQ(row.keys.end, 4);  // j <= 0 + 3
  EXPECT_EQ(row.slope, 0.25f);
  EXPECT_EQ(row.diagonal, 3.0f);
  EXPECT_FALSE(row.element_masks);
}

TEST(MaskTest, ScoreReadsTheBooleanMaskAndTheRange) {
  Tensor<bool, 4> allowed({2, 1, 1, 3});
  allowed(1, 0, 0, 2) = true;
  MaskParams<float> m;
  m.q_len = 5;
  m.k_len = 3;
  const float minus_infinity = -std::numeric_limits<float>::infinity();
  EXPECT_EQ(m.score(m.row(1, 0, 0), 1, 0, 0, 0, 1.0f), 1.0f) << "no mask: everything allowed";
  m.allowed = detail::Broadcast4<bool>(allowed.view());
  EXPECT_EQ(m.score(m.row(1, 7, 4), 1, 7, 4, 2, 1.0f), 1.0f);
  EXPECT_EQ(m.score(m.row(1, 7, 4), 1, 7, 4, 1, 1.0f), minus_infinity);
  EXPECT_EQ(m.score(m.row(0, 0, 0), 0, 0, 0, 2, 1.0f), minus_infinity);
  m.causal = Causal::top_left;
  EXPECT_EQ(m.score(m.row(1, 0, 1), 1, 0, 1, 2, std::numeric_limits<float>::quiet_NaN()), minus_infinity)
      << "outside the range: -inf selected, a NaN product does not survive";
}

// ---- masks and biases of rank 2 and 3 ------------------------------------------------------------------------

// The (B, H, Lq, Lk) tensor a rank-2 or rank-3 mask stands for under PyTorch's scaled_dot_product_attention rule
// (NumPy's: line the dimensions up from the right), written out element by element, without MaskView or Broadcast4:
// a (Lq, Lk) mask is m(i, j) for every batch and head, a (d0, Lq, Lk) one m(h, i, j) (d0 = H) or m(0, i, j) (d0 = 1).
template <typename U>
Tensor<U, 4> expand(const Tensor<U, 3>& m, Index batch, Index heads) {
  Tensor<U, 4> full({batch, heads, m.dim(1), m.dim(2)});
  for (Index b = 0; b < batch; ++b)
    for (Index h = 0; h < heads; ++h)
      for (Index i = 0; i < m.dim(1); ++i)
        for (Index j = 0; j < m.dim(2); ++j) full(b, h, i, j) = m(m.dim(0) == 1 ? 0 : h, i, j);
  return full;
}
template <typename U>
Tensor<U, 4> expand(const Tensor<U, 2>& m, Index batch, Index heads) {  // (Lq, Lk) is (1, Lq, Lk)
  return expand(Tensor<U, 3>(m.view().template reshape<3>({1, m.dim(0), m.dim(1)})), batch, heads);
}

SELFATTN_SCALAR_TEST_SUITE(MaskRankTest);

const char* kernel_name(Kernel kernel) {
  return kernel == Kernel::reference ? "reference" : kernel == Kernel::fused ? "fused" : "decode";
}

// Each rank-2 or rank-3 mask or bias, on each forward kernel, gives bitwise the result of its rank-4 expansion, and
// the brute-force attention of that expansion (tests/support/brute_force.hpp) to rounding; with a bias, the backward
// too, dbias in the bias's own (broadcast) shape.
TYPED_TEST(MaskRankTest, RankTwoAndThreeEqualTheirRankFourExpansionOnEveryKernel) {
  using T = TypeParam;
  const T minus_infinity = -std::numeric_limits<T>::infinity();
  test::Random random(70);
  const Index B = 2, H = 4, Hkv = 2, Lq = 7, Lk = 9, D = 8;
  const auto q = random.normal_tensor<T, 4>({B, H, Lq, D});
  const auto k = random.normal_tensor<T, 4>({B, Hkv, Lk, D});
  const auto v = random.normal_tensor<T, 4>({B, Hkv, Lk, D});
  const auto dout = random.normal_tensor<T, 4>({B, H, Lq, D});
  const Tensor<bool, 2> allowed2 = random.bool_tensor<2>({Lq, Lk}, 0.7);
  const Tensor<bool, 3> allowed3 = random.bool_tensor<3>({H, Lq, Lk}, 0.7);
  const Tensor<bool, 3> allowed3_shared = random.bool_tensor<3>({1, Lq, Lk}, 0.7);
  Tensor<T, 2> bias2 = random.normal_tensor<T, 2>({Lq, Lk});
  Tensor<T, 3> bias3 = random.normal_tensor<T, 3>({H, Lq, Lk});
  bias2(1, 3) = minus_infinity;
  for (Index j = 0; j < Lk; ++j) bias3(2, 4, j) = minus_infinity;  // a fully masked row in head 2

  struct Case {
    std::string name;
    AttentionOptions<T> low, full;  // the rank-2/3 tensors, and their expansions
  };
  std::deque<Tensor<bool, 4>> full_masks;  // the views in the cases point into these: a deque never moves them
  std::deque<Tensor<T, 4>> full_biases;
  std::vector<Case> cases;
  const auto add = [&](const std::string& name, auto&& set) {
    Case c{name, {}, {}};
    set(c.low, c.full);
    cases.push_back(c);
  };
  const auto add_allowed = [&](const std::string& name, const auto& allowed) {
    add(name, [&](auto& low, auto& full) {
      low.allowed = allowed;
      full.allowed = full_masks.emplace_back(expand(allowed, B, H));
    });
  };
  add_allowed("allowed (Lq, Lk)", allowed2);
  add_allowed("allowed (H, Lq, Lk)", allowed3);
  add_allowed("allowed (1, Lq, Lk)", allowed3_shared);
  add("bias (Lq, Lk)", [&](auto& low, auto& full) {
    low.bias = bias2;
    full.bias = full_biases.emplace_back(expand(bias2, B, H));
  });
  add("bias (H, Lq, Lk), allowed (Lq, Lk), bottom-right causal", [&](auto& low, auto& full) {
    low.bias = bias3;
    low.allowed = allowed2;
    low.causal = full.causal = Causal::bottom_right;
    full.bias = full_biases.emplace_back(expand(bias3, B, H));
    full.allowed = full_masks.emplace_back(expand(allowed2, B, H));
  });

  for (const Case& c : cases) {
    const test::BruteForceResult<T> expected = test::brute_force_attention<T>(q, k, v, c.full);
    for (Kernel kernel : {Kernel::reference, Kernel::fused, Kernel::decode}) {
      SCOPED_TRACE(c.name + ", " + kernel_name(kernel) + " kernel");
      AttentionOptions<T> low = c.low, full = c.full;
      low.kernel = full.kernel = kernel;
      const AttentionForward<T> from_low = sdpa_forward(q, k, v, low), from_full = sdpa_forward(q, k, v, full);
      EXPECT_TRUE(test::all_close(from_low.out, from_full.out, 0.0));
      EXPECT_TRUE(test::all_close(from_low.lse, from_full.lse, 0.0));
      EXPECT_TRUE(test::all_close(from_low.out, expected.out, test::default_tolerance<T>()));
      EXPECT_TRUE(test::all_close(from_low.lse, expected.lse, test::default_tolerance<T>()));
      if (!c.low.bias.data()) continue;
      // The backward: dbias has the bias's rank-4 shape (1, 1|H, Lq, Lk), summed over what it broadcasts over.
      const AttentionGradients<T> g = sdpa_backward(q, k, v, from_low.out, from_low.lse, dout, low);
      AttentionOptions<T> as_rank4 = c.low;  // the same memory, viewed as rank 4 by hand
      as_rank4.bias = c.low.bias.dim(1) == 1 ? TensorView<const T, 4>(bias2.data(), {1, 1, Lq, Lk})
                                             : TensorView<const T, 4>(bias3.data(), {1, H, Lq, Lk});
      const test::BruteForceGradients<T> expected_g = test::brute_force_backward<T>(q, k, v, dout, as_rank4);
      EXPECT_EQ(g.dbias.shape(), as_rank4.bias.shape());
      EXPECT_TRUE(test::all_close(g.dq, expected_g.dq, test::default_tolerance<T>()));
      EXPECT_TRUE(test::all_close(g.dk, expected_g.dk, test::default_tolerance<T>()));
      EXPECT_TRUE(test::all_close(g.dv, expected_g.dv, test::default_tolerance<T>()));
      EXPECT_TRUE(test::all_close(g.dbias, expected_g.dbias, test::default_tolerance<T>()));
    }
  }
}

// nn.MultiheadAttention's key_padding_mask (B, Lk), true = padding, becomes allowed (B, 1, 1, Lk), true = may
// attend: negated, element by element. Padding that is a suffix gives the attention of the same key_lengths; left
// padding and holes, that of an `allowed` written out by hand.
TYPED_TEST(MaskRankTest, KeyPaddingMaskBecomesTheAllowedMaskItMeans) {
  using T = TypeParam;
  test::Random random(71);
  const Index B = 2, H = 2, Lq = 3, Lk = 6, D = 4;
  Tensor<bool, 2> suffix({B, Lk});  // sequence 0: 6 real keys; sequence 1: 4 real keys, then 2 of padding
  suffix(1, 4) = suffix(1, 5) = true;
  const Tensor<bool, 4> keep = allowed_from_key_padding(suffix);
  ASSERT_EQ(keep.shape(), (std::array<Index, 4>{B, 1, 1, Lk}));
  for (Index b = 0; b < B; ++b)
    for (Index j = 0; j < Lk; ++j) EXPECT_EQ(keep(b, 0, 0, j), !suffix(b, j)) << "b " << b << ", j " << j;

  const auto q = random.normal_tensor<T, 4>({B, H, Lq, D});
  const auto k = random.normal_tensor<T, 4>({B, H, Lk, D});
  const auto v = random.normal_tensor<T, 4>({B, H, Lk, D});
  AttentionOptions<T> padded, lengths;
  padded.allowed = keep;
  lengths.key_lengths = {6, 4};
  EXPECT_TRUE(test::all_close(sdpa_forward(q, k, v, padded).out, sdpa_forward(q, k, v, lengths).out,
                              test::default_tolerance<T>()));

  Tensor<bool, 2> holes({B, Lk});  // left padding in sequence 0, a hole in sequence 1; read through a view
  holes(0, 0) = holes(0, 1) = holes(1, 3) = true;
  const Tensor<bool, 4> keep_holes = allowed_from_key_padding(TensorView<const bool, 2>(holes));
  Tensor<bool, 4> by_hand({B, 1, 1, Lk});
  by_hand.fill(true);
  by_hand(0, 0, 0, 0) = by_hand(0, 0, 0, 1) = by_hand(1, 0, 0, 3) = false;
  AttentionOptions<T> from_padding, from_hand;
  from_padding.allowed = keep_holes;
  from_hand.allowed = by_hand;
  EXPECT_TRUE(test::all_close(sdpa_forward(q, k, v, from_padding).out, sdpa_forward(q, k, v, from_hand).out, 0.0));
}

// A rank-2 or rank-3 mask that does not broadcast still throws before anything is computed, naming the option and
// giving the rank-4 shape it was read as. PyTorch's nn.MultiheadAttention orders a 3-D mask (B * H, Lq, Lk); read
// by scaled_dot_product_attention's rule its first dimension is the heads, so with B > 1 it is refused, not misread.
TEST(MaskRankTest, RankTwoAndThreeMasksOfTheWrongShapeThrowNamingThem) {
  const Tensor<float, 4> q({2, 4, 5, 8}), k({2, 2, 6, 8}), v({2, 2, 6, 8});
  const Tensor<bool, 2> wide({5, 7});
  const Tensor<float, 3> three_heads({3, 5, 6});
  const Tensor<bool, 3> batch_times_heads({8, 5, 6});
  AttentionOptions<float> opts;
  opts.allowed = wide;
  test::expect_error<ShapeError>([&] { sdpa_forward(q, k, v, opts); },
                                 {"[sdpa_forward]", "opts.allowed", "(2, 4, 5, 6)", "got (1, 1, 5, 7)"});
  opts.allowed = batch_times_heads;
  test::expect_error<ShapeError>([&] { sdpa_forward(q, k, v, opts); }, {"opts.allowed", "got (1, 8, 5, 6)"});
  opts.allowed = {};
  opts.bias = three_heads;
  test::expect_error<ShapeError>([&] { sdpa_forward(q, k, v, opts); }, {"opts.bias", "got (1, 3, 5, 6)"});
}

}  // namespace
}  // namespace selfattn::test
