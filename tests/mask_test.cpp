// Tests of mask.hpp: the key range of the structural masks and the per-element terms, checked against
// the definitions in API.md one mask at a time.
#include <selfattn/detail/mask.hpp>

#include "support/brute_force.hpp"
#include "support/random.hpp"

#include <gtest/gtest.h>

#include <limits>

#include <vector>

namespace selfattn {
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

}  // namespace
}  // namespace selfattn
