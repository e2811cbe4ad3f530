// Tests of options.hpp: the defaults API.md promises ("every field optional"), key_lengths taking a vector of any
// integer type, and masks of rank 2 and 3 (MaskView) read as rank 4.
#include <selfattn/options.hpp>

#include <gtest/gtest.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <type_traits>
#include <vector>

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

// PyTorch's scaled_dot_product_attention broadcasts attn_mask against (B, H, Lq, Lk) from the right: a 2-D mask is
// (1, 1, Lq, Lk), a 3-D one (1, d0, Lq, Lk). The masks of the options take those ranks as views of the same memory,
// the added dimensions of extent 1 and stride 0.
TEST(OptionsTest, MasksOfRankTwoAndThreeAreReadAsRankFourFromTheRight) {
  Tensor<bool, 2> mask({5, 7});
  Tensor<float, 3> bias({3, 5, 7});
  AttentionOptions<float> opts;
  opts.allowed = mask;
  opts.bias = bias;
  EXPECT_EQ(opts.allowed.data(), mask.data());
  EXPECT_EQ(opts.allowed.shape(), (std::array<Index, 4>{1, 1, 5, 7}));
  EXPECT_EQ(opts.allowed.strides(), (std::array<Index, 4>{0, 0, 7, 1}));
  EXPECT_EQ(opts.bias.data(), bias.data());
  EXPECT_EQ(opts.bias.shape(), (std::array<Index, 4>{1, 3, 5, 7}));  // the first dimension lines up with the heads
  EXPECT_EQ(opts.bias.strides(), (std::array<Index, 4>{0, 35, 7, 1}));

  // Strided views keep their strides: columns 2..5 of every row of a (3, 5, 9) buffer.
  Tensor<float, 3> wide({3, 5, 9});
  opts.bias = TensorView<const float, 3>(wide.data() + 2, {3, 5, 4}, {45, 9, 1});
  EXPECT_EQ(opts.bias.data(), wide.data() + 2);
  EXPECT_EQ(opts.bias.shape(), (std::array<Index, 4>{1, 3, 5, 4}));
  EXPECT_EQ(opts.bias.strides(), (std::array<Index, 4>{0, 45, 9, 1}));

  // Rank 4 stays as it is, writable views included; copies of the options keep the view.
  Tensor<bool, 4> full({2, 1, 5, 7});
  opts.allowed = TensorView<bool, 4>(full);
  EXPECT_EQ(opts.allowed.shape(), full.shape());
  EXPECT_EQ(opts.allowed.strides(), full.strides());
  const AttentionOptions<float> copy = opts;
  EXPECT_EQ(copy.allowed.data(), full.data());
  const TensorView<const bool, 4> as_documented = copy.allowed;  // API.md: a TensorView<const bool, 4>
  EXPECT_EQ(as_documented.shape(), full.shape());
  opts.allowed = {};
  EXPECT_EQ(opts.allowed.data(), nullptr);

  // A temporary tensor does not convert (its view would dangle), at any rank.
  static_assert(std::is_convertible_v<Tensor<bool, 2>&, MaskView<bool>>);
  static_assert(std::is_convertible_v<const Tensor<float, 3>&, MaskView<float>>);
  static_assert(!std::is_convertible_v<Tensor<bool, 2>&&, MaskView<bool>>);
  static_assert(!std::is_convertible_v<Tensor<float, 3>, MaskView<float>>);
  static_assert(!std::is_convertible_v<Tensor<float, 4>, MaskView<float>>);
}

// A function written against the documented type, std::vector<Index>.
Index total_of(const std::vector<Index>& lengths) {
  Index total = 0;
  for (Index length : lengths) total += length;
  return total;
}

TEST(OptionsTest, KeyLengthsKeepsTheVectorInterface) {
  AttentionOptions<float> opts;
  opts.key_lengths = {8, 5, 1};
  EXPECT_FALSE(opts.key_lengths.empty());
  EXPECT_EQ(opts.key_lengths.size(), 3u);
  EXPECT_EQ(opts.key_lengths[1], 5);
  EXPECT_EQ(opts.key_lengths.data()[2], 1);
  static_assert(std::is_same_v<decltype(opts.key_lengths.data()), Index*>);
  opts.key_lengths.push_back(4);
  EXPECT_EQ(total_of(opts.key_lengths), 18);  // binds to const std::vector<Index>&
  const std::vector<Index> copy = opts.key_lengths;
  EXPECT_EQ(copy, (std::vector<Index>{8, 5, 1, 4}));
  EXPECT_EQ(opts.key_lengths, copy);
  opts.key_lengths = {};
  EXPECT_TRUE(opts.key_lengths.empty());
  opts.key_lengths = {3};
  EXPECT_EQ(opts.key_lengths.size(), 1u);

  // A std::vector<Index> (lvalue or moved).
  std::vector<Index> lengths{6, 0};
  opts.key_lengths = lengths;
  EXPECT_EQ(opts.key_lengths, lengths);
  const Index* storage = lengths.data();
  opts.key_lengths = std::move(lengths);
  EXPECT_EQ(opts.key_lengths.data(), storage);  // moved, not copied
}

TEST(OptionsTest, KeyLengthsFromAnyIntegerVector) {
  AttentionOptions<double> opts;
  opts.key_lengths = std::vector<int>{8, 5, 1};
  EXPECT_EQ(opts.key_lengths, (std::vector<Index>{8, 5, 1}));
  const std::vector<std::uint32_t> unsigned_lengths{7, 0};
  opts.key_lengths = unsigned_lengths;
  EXPECT_EQ(opts.key_lengths, (std::vector<Index>{7, 0}));
  opts.key_lengths = std::vector<std::size_t>{3, 2, 1, 0};
  EXPECT_EQ(opts.key_lengths, (std::vector<Index>{3, 2, 1, 0}));
  opts.key_lengths = std::vector<std::int16_t>{12};
  EXPECT_EQ(opts.key_lengths, (std::vector<Index>{12}));
  opts.key_lengths = std::vector<std::uint8_t>{255};
  EXPECT_EQ(opts.key_lengths, (std::vector<Index>{255}));
  opts.key_lengths = std::vector<long long>{};
  EXPECT_TRUE(opts.key_lengths.empty());

  // Negative values pass through unchanged: the attention call reports them (opts.key_lengths[b]).
  opts.key_lengths = std::vector<int>{-1, 4};
  EXPECT_EQ(opts.key_lengths[0], -1);

  // A value that does not fit in Index cannot be a key length: refused at the assignment, opts unchanged.
  const std::vector<std::uint64_t> too_long{2, std::numeric_limits<std::uint64_t>::max()};
  EXPECT_THROW(opts.key_lengths = too_long, std::invalid_argument);
  EXPECT_EQ(opts.key_lengths, (std::vector<Index>{-1, 4}));

  // Not from bool or floating-point vectors.
  static_assert(std::is_convertible_v<std::vector<int>, KeyLengths>);
  static_assert(std::is_convertible_v<std::vector<unsigned long>, KeyLengths>);
  static_assert(!std::is_convertible_v<std::vector<bool>, KeyLengths>);
  static_assert(!std::is_convertible_v<std::vector<double>, KeyLengths>);
  static_assert(std::is_base_of_v<std::vector<Index>, KeyLengths>);
}

}  // namespace
}  // namespace selfattn
