// Tests of dropout.hpp: the counter-based stream is a pure function of (seed, b, h, i, j), uniform, and
// sensitive to every part of its key.
#include <selfattn/attention.hpp>
#include <selfattn/detail/dropout.hpp>

#include <gtest/gtest.h>

#include <cmath>
#include <set>

namespace selfattn {
namespace {

TEST(DropoutTest, SameKeySameNumberEveryTime) {
  for (Index j = 0; j < 100; ++j) EXPECT_EQ(detail::dropout_uniform(42, 1, 2, 3, j), detail::dropout_uniform(42, 1, 2, 3, j));
}

TEST(DropoutTest, EveryPartOfTheKeyChangesTheNumber) {
  const double base = detail::dropout_uniform(7, 1, 1, 1, 1);
  EXPECT_NE(base, detail::dropout_uniform(8, 1, 1, 1, 1));
  EXPECT_NE(base, detail::dropout_uniform(7, 2, 1, 1, 1));
  EXPECT_NE(base, detail::dropout_uniform(7, 1, 2, 1, 1));
  EXPECT_NE(base, detail::dropout_uniform(7, 1, 1, 2, 1));
  EXPECT_NE(base, detail::dropout_uniform(7, 1, 1, 1, 2));
  // Swapping coordinates must not collide (a symmetric hash would).
  EXPECT_NE(detail::dropout_uniform(7, 0, 0, 1, 2), detail::dropout_uniform(7, 0, 0, 2, 1));
}

TEST(DropoutTest, UniformOnTheUnitInterval) {
  const int n = 200000;
  double sum = 0, sum_squares = 0;
  int kept = 0;
  detail::DropoutParams<float> dropout;
  dropout.p = 0.3f;
  dropout.seed = 123;
  for (int t = 0; t < n; ++t) {
    const double u = detail::dropout_uniform(123, t % 3, t % 7, t / 64, t % 64);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
    sum_squares += u * u;
    kept += dropout.keep(t % 3, t % 7, t / 64, t % 64);
  }
  EXPECT_NEAR(sum / n, 0.5, 0.005);
  EXPECT_NEAR(sum_squares / n - (sum / n) * (sum / n), 1.0 / 12, 0.002);
  EXPECT_NEAR(static_cast<double>(kept) / n, 0.7, 0.01);
  EXPECT_FLOAT_EQ(dropout.keep_scale(), 1.0f / 0.7f);
}

TEST(DropoutTest, InactiveAtZero) {
  detail::DropoutParams<double> dropout;
  EXPECT_FALSE(dropout.active());
  dropout.p = 0.1;
  EXPECT_TRUE(dropout.active());
}

// The mask as sdpa_forward applies it: with q = k = 0 every allowed weight is 1 / Lk, and with v_j = e_j
// (one-hot rows) the output o_ij = keep_ij / ((1 - p) Lk) shows the keep decision of every (b, h, i, j).
Tensor<float, 4> observed_keep_mask(float p, std::uint64_t seed) {
  const Index B = 2, H = 2, Lq = 64, Lk = 256;
  const Tensor<float, 4> q({B, H, Lq, 8}), k({B, H, Lk, 8});
  Tensor<float, 4> v({B, H, Lk, Lk});
  for (Index b = 0; b < B; ++b)
    for (Index h = 0; h < H; ++h)
      for (Index j = 0; j < Lk; ++j) v(b, h, j, j) = 1.0f;
  AttentionOptions<float> opts;
  opts.dropout_p = p;
  opts.seed = seed;
  Tensor<float, 4> out = scaled_dot_product_attention(q, k, v, opts);
  for (Index n = 0; n < out.size(); ++n) out.data()[n] *= (1.0f - p) * static_cast<float>(Lk);
  return out;
}

TEST(DropoutTest, KeptFractionOfALargeTensorIsOneMinusP) {
  for (float p : {0.1f, 0.5f, 0.8f}) {
    const Tensor<float, 4> keep = observed_keep_mask(p, 2026);
    Index kept = 0;
    for (Index n = 0; n < keep.size(); ++n) {
      ASSERT_TRUE(std::abs(keep.data()[n]) < 1e-4f || std::abs(keep.data()[n] - 1.0f) < 1e-4f) << "not a 0/1 mask";
      kept += keep.data()[n] > 0.5f;
    }
    EXPECT_NEAR(static_cast<double>(kept) / static_cast<double>(keep.size()), 1.0 - p, 0.01) << "p = " << p;
  }
}

TEST(DropoutTest, SameSeedSameMaskOtherSeedOtherMask) {
  const Tensor<float, 4> a = observed_keep_mask(0.3f, 1), b = observed_keep_mask(0.3f, 1), c = observed_keep_mask(0.3f, 2);
  Index same = 0, differ = 0;
  for (Index n = 0; n < a.size(); ++n) {
    same += (a.data()[n] > 0.5f) == (b.data()[n] > 0.5f);
    differ += (a.data()[n] > 0.5f) != (c.data()[n] > 0.5f);
  }
  EXPECT_EQ(same, a.size());
  // Two independent masks with keep rate 0.7 disagree on 2 * 0.7 * 0.3 = 42% of entries.
  EXPECT_NEAR(static_cast<double>(differ) / static_cast<double>(a.size()), 0.42, 0.01);
}

}  // namespace
}  // namespace selfattn
