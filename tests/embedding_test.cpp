// Tests of selfattn/nn/embedding.hpp: the lookup gathers rows, the backward scatter-adds (checked by central finite
// differences in double, repeated tokens included), the _into form accumulates, every error names its argument and
// writes nothing; and the gradient of a whole tied-embedding language model (embedding -> TransformerStack ->
// head sharing the table -> softmax_cross_entropy), the composition examples/tiny_lm trains with.
#include <selfattn/nn/embedding.hpp>
#include <selfattn/selfattn.hpp>
#include <selfattn/train/cross_entropy.hpp>

#include "support/compare.hpp"
#include "support/expect_error.hpp"
#include "support/gradcheck.hpp"
#include "support/random.hpp"

#include <gtest/gtest.h>

#include <stdexcept>
#include <vector>

namespace selfattn::test {
namespace {

Tensor<Index, 2> token_tensor(const std::vector<std::vector<Index>>& rows) {
  Tensor<Index, 2> t({static_cast<Index>(rows.size()), rows.empty() ? 0 : static_cast<Index>(rows[0].size())});
  for (std::size_t b = 0; b < rows.size(); ++b)
    for (std::size_t l = 0; l < rows[b].size(); ++l) t(static_cast<Index>(b), static_cast<Index>(l)) = rows[b][l];
  return t;
}

TEST(EmbeddingTest, GathersTheRowOfEachToken) {
  Random rng(1);
  const Tensor<double, 2> table = rng.normal_tensor<double, 2>({5, 3});
  const Tensor<Index, 2> tokens = token_tensor({{4, 0, 4}, {2, 2, 1}});
  const Tensor<double, 3> y = embedding<double>(table, tokens);
  ASSERT_EQ(y.shape(), (std::array<Index, 3>{2, 3, 3}));
  for (Index b = 0; b < 2; ++b)
    for (Index l = 0; l < 3; ++l)
      for (Index e = 0; e < 3; ++e) EXPECT_EQ(y(b, l, e), table(tokens(b, l), e)) << b << " " << l << " " << e;
}

TEST(EmbeddingTest, ReadsAStridedTable) {
  // Rows 1, 3, 5 of a (6, 4) tensor, as a (3, 4) view with row stride 8.
  Random rng(2);
  Tensor<float, 2> storage = rng.normal_tensor<float, 2>({6, 4});
  const TensorView<const float, 2> table(storage.data() + 4, {3, 4}, {8, 1});
  const Tensor<Index, 2> tokens = token_tensor({{2, 0}});
  const Tensor<float, 3> y = embedding<float>(table, tokens);
  for (Index e = 0; e < 4; ++e) {
    EXPECT_EQ(y(0, 0, e), storage(5, e));
    EXPECT_EQ(y(0, 1, e), storage(1, e));
  }
}

TEST(EmbeddingTest, BackwardMatchesFiniteDifferencesWithRepeatedTokens) {
  Random rng(3);
  Tensor<double, 2> table = rng.normal_tensor<double, 2>({6, 4});
  const Tensor<Index, 2> tokens = token_tensor({{1, 3, 1, 5}, {3, 3, 0, 1}});  // 1 and 3 three times, 2 and 4 never
  const Tensor<double, 3> weights = rng.normal_tensor<double, 3>({2, 4, 4});  // loss = sum(y * weights): dy = weights
  const Tensor<double, 2> analytic = embedding_backward<double>(tokens, weights, 6);
  const Tensor<double, 2> numeric =
      numerical_gradient(table, [&] { return weighted_sum(embedding<double>(table, tokens), weights); });
  EXPECT_TRUE(all_close(analytic, numeric, 1e-9));
  for (Index e = 0; e < 4; ++e) {  // tokens that do not occur get no gradient
    EXPECT_EQ(analytic(2, e), 0.0);
    EXPECT_EQ(analytic(4, e), 0.0);
  }
}

TEST(EmbeddingTest, BackwardIntoAddsToWhatIsThere) {
  Random rng(4);
  const Tensor<Index, 2> tokens = token_tensor({{0, 2, 2}});
  const Tensor<float, 3> dy = rng.normal_tensor<float, 3>({1, 3, 5});
  Tensor<float, 2> dweight = rng.normal_tensor<float, 2>({3, 5});
  const Tensor<float, 2> before = dweight;
  embedding_backward_into<float>(tokens, dy, dweight);
  for (Index e = 0; e < 5; ++e) {
    EXPECT_FLOAT_EQ(dweight(0, e), before(0, e) + dy(0, 0, e));
    EXPECT_EQ(dweight(1, e), before(1, e));
    EXPECT_FLOAT_EQ(dweight(2, e), before(2, e) + dy(0, 1, e) + dy(0, 2, e));
  }
}

TEST(EmbeddingTest, EmptyBatchOrLengthGivesEmptyResults) {
  const Tensor<double, 2> table({4, 3});
  const Tensor<Index, 2> no_batch({0, 5}), no_length({2, 0});
  EXPECT_EQ(embedding<double>(table, no_batch).shape(), (std::array<Index, 3>{0, 5, 3}));
  EXPECT_EQ(embedding<double>(table, no_length).shape(), (std::array<Index, 3>{2, 0, 3}));
  const Tensor<double, 3> dy({2, 0, 3});
  const Tensor<double, 2> d = embedding_backward<double>(no_length, dy, 4);
  EXPECT_EQ(d.shape(), (std::array<Index, 2>{4, 3}));
  for (Index n = 0; n < d.size(); ++n) EXPECT_EQ(d.data()[n], 0.0);
}

TEST(EmbeddingTest, ErrorsNameTheArgumentAndWriteNothing) {
  const Tensor<float, 2> table({4, 3});
  const Tensor<Index, 2> too_large = token_tensor({{0, 1}, {2, 4}}), negative = token_tensor({{-1}});
  expect_error<std::invalid_argument>([&] { (void)embedding<float>(table, too_large); },
                                      {"[embedding]", "tokens", "id 4 at (1, 1)", "[0, 4)"});
  expect_error<std::invalid_argument>([&] { (void)embedding<float>(table, negative); },
                                      {"tokens", "id -1 at (0, 0)"});
  const Tensor<Index, 2> tokens = token_tensor({{0, 3}});
  Tensor<float, 2> dweight({4, 3});
  dweight.fill(7.0f);
  const Tensor<float, 3> long_dy({1, 3, 3}), narrow_dy({1, 2, 2});
  expect_error<ShapeError>([&] { embedding_backward_into<float>(tokens, long_dy, dweight); },
                           {"[embedding_backward_into]", "dy", "expected shape (1, 2, *), got (1, 3, 3)"});
  expect_error<ShapeError>([&] { embedding_backward_into<float>(tokens, narrow_dy, dweight); },
                           {"dweight", "expected shape (*, 2), got (4, 3)"});
  Tensor<float, 3> dy({1, 2, 3});
  dy.fill(1.0f);
  Tensor<float, 2> small({3, 3});
  small.fill(7.0f);
  expect_error<std::invalid_argument>([&] { embedding_backward_into<float>(tokens, dy, small); },
                                      {"tokens", "id 3 at (0, 1)", "[0, 3)"});
  for (Index n = 0; n < small.size(); ++n) EXPECT_EQ(small.data()[n], 7.0f) << "written before the check failed";
  expect_error<std::invalid_argument>([&] { (void)embedding_backward<float>(tokens, dy, -1); },
                                      {"[embedding_backward]", "vocab_size", "got -1"});
}

// The loss of a tiny language model whose output head is the embedding table (tied), differentiated with respect
// to the table: the table's gradient is the embedding's scatter-add plus the head's dW.
TEST(EmbeddingTest, TiedLanguageModelGradientMatchesFiniteDifferences) {
  constexpr Index vocab = 7, e = 8, batch = 2, length = 5;
  TransformerStackConfig cfg;
  cfg.layer = decoder_layer_config(e, 2);
  cfg.layer.attention.rope_dim = e / 2;
  cfg.num_layers = 2;
  cfg.final_norm = true;
  const TransformerStack<double> stack(cfg, 11);
  Random rng(5);
  Tensor<double, 2> table = rng.normal_tensor<double, 2>({vocab, e}, 0.5);
  const Tensor<Index, 2> tokens = token_tensor({{1, 4, 4, 0, 6}, {2, 2, 5, 3, 1}});
  Tensor<Index, 2> targets = token_tensor({{4, 4, 0, 6, 2}, {2, 5, 3, 1, -100}});  // the last one ignored

  const auto loss = [&](CrossEntropy<double>* keep, TransformerStackForward<double>* fwd) {
    TransformerStackForward<double> f = stack.forward(embedding<double>(table, tokens));
    const Tensor<double, 3> logits = linear<double>(f.output, table);  // logits = h table^T
    CrossEntropy<double> ce = softmax_cross_entropy<double>(logits, targets);
    const double value = ce.loss;
    if (keep) *keep = std::move(ce);
    if (fwd) *fwd = std::move(f);
    return value;
  };
  CrossEntropy<double> ce;
  TransformerStackForward<double> fwd;
  loss(&ce, &fwd);
  EXPECT_EQ(ce.count, batch * length - 1);
  const LinearGradients<double> head = linear_backward<double>(fwd.output, table, ce.d_logits, false);
  const TransformerStackGradients<double> g = stack.backward(head.dx, fwd);
  Tensor<double, 2> analytic = embedding_backward<double>(tokens, g.d_input, vocab);
  analytic += head.dweight;
  const Tensor<double, 2> numeric = numerical_gradient(table, [&] { return loss(nullptr, nullptr); });
  EXPECT_TRUE(all_close(analytic, numeric, 1e-7));
}

}  // namespace
}  // namespace selfattn::test
