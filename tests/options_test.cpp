// Tests of options.hpp: the defaults API.md promises ("every field optional").
#include <selfattn/options.hpp>

#include <gtest/gtest.h>

namespace selfattn {
namespace {

TEST(OptionsTest, DefaultsMeanPlainAttention) {
  const AttentionOptions<float> opts;
  EXPECT_EQ(opts.causal, Causal::none);
  EXPECT_TRUE(opts.key_lengths.empty());
  EXPECT_EQ(opts.allowed.data(), nullptr);
  EXPECT_EQ(opts.bias.data(), nullptr);
  EXPECT_EQ(opts.window_left, -1);
  EXPECT_EQ(opts.window_right, -1);
  EXPECT_TRUE(opts.alibi_slopes.empty());
  EXPECT_FALSE(opts.scale.has_value());
  EXPECT_EQ(opts.dropout_p, 0.0f);
  EXPECT_EQ(opts.seed, 0u);
  EXPECT_FALSE(opts.need_weights);
}

TEST(OptionsTest, MasksBindToTensorsOfTheRightElementType) {
  Tensor<bool, 4> mask({1, 1, 2, 2});
  Tensor<double, 4> bias({1, 1, 2, 2});
  AttentionOptions<double> opts;
  opts.allowed = mask;
  opts.bias = bias;
  EXPECT_EQ(opts.allowed.data(), mask.data());
  EXPECT_EQ(opts.bias.data(), bias.data());
  EXPECT_EQ(opts.bias.shape(), bias.shape());
}

}  // namespace
}  // namespace selfattn
