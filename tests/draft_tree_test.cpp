// Tests of tree verification for speculative decoding (nn/draft_tree.hpp, MultiHeadAttention::step_tree,
// KVCache::keep_draft_path): every draft's row of one tree step equals one-token steps along the path to it, the
// cache keeps exactly the accepted path (as if only it had been stepped), and bad trees, paths and caches are
// rejected by name with the cache unchanged.
#include <selfattn/selfattn.hpp>

#include "support/compare.hpp"
#include "support/expect_error.hpp"
#include "support/module_config.hpp"
#include "support/random.hpp"
#include "support/scalars.hpp"

#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

namespace selfattn::test {
namespace {

SELFATTN_SCALAR_TEST_SUITE(DraftTreeTest);

struct ModuleCase {
  std::string name;
  Index E, H, Hkv, rope_dim;
  RopeStyle style;
};

const std::vector<ModuleCase> module_cases = {
    {"plain", 16, 4, 0, 0, RopeStyle::half},
    {"gqa", 16, 4, 2, 0, RopeStyle::half},
    {"rope full half", 16, 2, 0, 8, RopeStyle::half},
    {"rope partial interleaved, mqa", 16, 4, 1, 2, RopeStyle::interleaved},
};

template <typename T>
MultiHeadAttention<T> make_module(const ModuleCase& c, Random& random) {
  MultiHeadAttention<T> mha(ModuleConfig(c.E, c.H).kv_heads(c.Hkv).rope(c.rope_dim, c.style), 17);
  randomize_biases(mha, random);
  return mha;
}

// Row l of every sequence of x (B, L, E), as (B, 1, E).
template <typename T>
Tensor<T, 3> row(const Tensor<T, 3>& x, Index l) {
  Tensor<T, 3> y({x.dim(0), 1, x.dim(2)});
  for (Index b = 0; b < x.dim(0); ++b)
    for (Index e = 0; e < x.dim(2); ++e) y(b, 0, e) = x(b, l, e);
  return y;
}

// A random tree of k drafts: each draft follows the prefix (-1) or any earlier draft.
DraftTree random_tree(Index k, Random& random) {
  DraftTree tree;
  for (Index i = 0; i < k; ++i) tree.parents.push_back(random.integer(-1, i - 1));
  return tree;
}

std::vector<DraftTree> trees_to_check(Random& random) {
  std::vector<DraftTree> trees = {DraftTree::chain(1), DraftTree::chain(4), DraftTree{{-1, 0, 0, 1, -1, 4}},
                                  DraftTree{{-1, -1, -1}}};
  for (Index k : {2, 5, 8}) trees.push_back(random_tree(k, random));
  return trees;
}

// Two sequences with 5 and 3 cached tokens (the second padded in the prefill), so their drafts sit at different
// positions and the mask's columns differ per sequence.
template <typename T>
KVCache<T> prefilled_cache(const MultiHeadAttention<T>& mha, Index E, Random& random) {
  auto cache = mha.make_cache(2);
  mha.step(random.normal_tensor<T, 3>({2, 5, E}), cache, {}, {5, 3});
  return cache;
}

TEST(DraftTree, DepthsPathsAndAncestors) {
  const DraftTree tree{{-1, 0, 0, 1, -1, 4}};
  EXPECT_EQ(tree.size(), 6);
  EXPECT_EQ(tree.depths(), (std::vector<Index>{0, 1, 1, 2, 0, 1}));
  EXPECT_EQ(tree.path_to(3), (std::vector<Index>{0, 1, 3}));
  EXPECT_EQ(tree.path_to(5), (std::vector<Index>{4, 5}));
  EXPECT_TRUE(tree.sees(3, 0));
  EXPECT_TRUE(tree.sees(3, 3));
  EXPECT_FALSE(tree.sees(3, 2));  // a sibling's branch
  EXPECT_FALSE(tree.sees(5, 0));  // another root's
  EXPECT_EQ(DraftTree::chain(3).parents, (std::vector<Index>{-1, 0, 1}));
  EXPECT_TRUE(DraftTree::chain(0).parents.empty());
  expect_error<std::invalid_argument>([] { DraftTree::chain(-1); }, {"DraftTree::chain", "k"});
  expect_error<std::invalid_argument>([&] { tree.path_to(6); }, {"node", "[0, 6)"});
}

// The tree step's row of draft i equals the last output of one-token steps along path_to(i), for every draft of
// every tree, on both sequences, with and without RoPE and grouped heads.
TYPED_TEST(DraftTreeTest, EachDraftEqualsStepsAlongItsPath) {
  using T = TypeParam;
  Random random(81);
  for (const ModuleCase& c : module_cases) {
    SCOPED_TRACE(c.name);
    const MultiHeadAttention<T> mha = make_module<T>(c, random);
    // with 5 and 3 cached tokens, and with none (the drafts attend only to each other)
    for (const KVCache<T>& prefilled : {prefilled_cache(mha, c.E, random), mha.make_cache(2)})
      for (const DraftTree& tree : trees_to_check(random)) {
        const auto drafts = random.normal_tensor<T, 3>({2, tree.size(), c.E});
        KVCache<T> tree_cache = prefilled;
        const Tensor<T, 3> y = mha.step_tree(drafts, tree_cache, tree);
        for (Index b = 0; b < 2; ++b)
          EXPECT_EQ(tree_cache.lengths()[static_cast<std::size_t>(b)],
                    prefilled.lengths()[static_cast<std::size_t>(b)] + tree.size());
        for (Index node = 0; node < tree.size(); ++node) {
          KVCache<T> path_cache = prefilled;
          Tensor<T, 3> last;
          for (Index draft : tree.path_to(node)) last = mha.step(row(drafts, draft), path_cache);
          EXPECT_TRUE(all_close(row(y, node), last, default_tolerance<T>()))
              << "draft " << node << " of a tree of " << tree.size();
        }
      }
  }
}

// After keep_draft_path, the cache holds what stepping only the accepted path would have left: lengths, positions,
// keys and values; and the next step gives the same output from both.
TYPED_TEST(DraftTreeTest, KeepingAPathEqualsSteppingOnlyIt) {
  using T = TypeParam;
  Random random(82);
  for (const ModuleCase& c : module_cases) {
    SCOPED_TRACE(c.name);
    const MultiHeadAttention<T> mha = make_module<T>(c, random);
    const KVCache<T> prefilled = prefilled_cache(mha, c.E, random);
    const DraftTree tree{{-1, 0, 0, 2, -1, 4, 3}};
    const auto drafts = random.normal_tensor<T, 3>({2, tree.size(), c.E});
    for (Index leaf : {0, 3, 5, 6}) {
      const std::vector<Index> path = tree.path_to(leaf);
      KVCache<T> kept = prefilled;
      mha.step_tree(drafts, kept, tree);
      for (Index b = 0; b < 2; ++b) kept.keep_draft_path(b, prefilled.lengths()[static_cast<std::size_t>(b)], path);
      KVCache<T> stepped = prefilled;
      for (Index draft : path) mha.step(row(drafts, draft), stepped);
      EXPECT_EQ(kept.lengths(), stepped.lengths()) << "leaf " << leaf;
      EXPECT_EQ(kept.positions(), stepped.positions()) << "leaf " << leaf;
      for (Index b = 0; b < 2; ++b) {
        EXPECT_TRUE(all_close(kept.sequence_keys(b), stepped.sequence_keys(b), default_tolerance<T>()))
            << "leaf " << leaf << ", sequence " << b;
        EXPECT_TRUE(all_close(kept.sequence_values(b), stepped.sequence_values(b), default_tolerance<T>()))
            << "leaf " << leaf << ", sequence " << b;
      }
      const auto next = random.normal_tensor<T, 3>({2, 1, c.E});
      EXPECT_TRUE(all_close(mha.step(next, kept), mha.step(next, stepped), default_tolerance<T>())) << "leaf " << leaf;
    }
    // An empty path rejects every draft: the prefilled cache again.
    KVCache<T> rejected = prefilled;
    mha.step_tree(drafts, rejected, tree);
    for (Index b = 0; b < 2; ++b) rejected.keep_draft_path(b, prefilled.lengths()[static_cast<std::size_t>(b)], {});
    EXPECT_EQ(rejected.lengths(), prefilled.lengths());
    EXPECT_EQ(rejected.positions(), prefilled.positions());
  }
}

// A whole decoder (3 pre-norm layers with RoPE and grouped heads, a final norm): every draft's row of one tree step
// equals stack steps along its path, and keeping a path leaves every layer's cache as stepping only it would.
TYPED_TEST(DraftTreeTest, StackEachDraftEqualsStepsAlongItsPath) {
  using T = TypeParam;
  Random random(85);
  TransformerStackConfig cfg;
  cfg.layer = decoder_layer_config(16, 4, 32);
  cfg.layer.attention.num_kv_heads = 2;
  cfg.layer.attention.rope_dim = 4;
  cfg.num_layers = 3;
  cfg.final_norm = true;
  const TransformerStack<T> model(cfg, 5);
  auto prefilled = model.make_cache(2);
  model.step(random.normal_tensor<T, 3>({2, 4, 16}), prefilled, {}, {4, 2});
  const DraftTree tree{{-1, 0, 1, 0, -1, 4}};
  const auto drafts = random.normal_tensor<T, 3>({2, tree.size(), 16});
  auto empty_tree_cache = prefilled;  // no drafts: nothing appended, nothing returned
  EXPECT_EQ(model.step_tree(Tensor<T, 3>({2, 0, 16}), empty_tree_cache, DraftTree{}).size(), 0);
  EXPECT_EQ(empty_tree_cache.layers[0].lengths(), prefilled.layers[0].lengths());
  auto tree_cache = prefilled;
  const Tensor<T, 3> y = model.step_tree(drafts, tree_cache, tree);
  for (Index node = 0; node < tree.size(); ++node) {
    auto path_cache = prefilled;
    Tensor<T, 3> last;
    for (Index draft : tree.path_to(node)) last = model.step(row(drafts, draft), path_cache);
    EXPECT_TRUE(all_close(row(y, node), last, default_tolerance<T>())) << "draft " << node;
    if (node != 2) continue;
    auto kept = tree_cache;  // keep the path to draft 2 in every layer
    for (Index b = 0; b < 2; ++b)
      kept.keep_draft_path(b, prefilled.layers[0].lengths()[static_cast<std::size_t>(b)], tree.path_to(node));
    for (std::size_t layer = 0; layer < kept.layers.size(); ++layer) {
      EXPECT_EQ(kept.layers[layer].positions(), path_cache.layers[layer].positions());
      for (Index b = 0; b < 2; ++b)
        EXPECT_TRUE(all_close(kept.layers[layer].sequence_keys(b), path_cache.layers[layer].sequence_keys(b),
                              default_tolerance<T>()))
            << "layer " << layer << ", sequence " << b;
    }
    const auto next = random.normal_tensor<T, 3>({2, 1, 16});
    EXPECT_TRUE(all_close(model.step(next, kept), model.step(next, path_cache), default_tolerance<T>()));
  }
  expect_error<std::invalid_argument>(
      [&] {
        model.step_tree(drafts, tree_cache, DraftTree{{-1, 0, 1, 3, -1, 4}});
      },
      {"[TransformerStack::step_tree] parents", "parents[3]"});
}

// A 16-bit cache verifies a tree as it steps: the same rounding of the same keys and values.
TEST(DraftTreeTest16, Bfloat16CacheEqualsStepsAlongThePath) {
  Random random(83);
  const MultiHeadAttention<float> mha = make_module<float>(module_cases[2], random);
  auto prefilled = mha.make_cache<bfloat16>(1);
  mha.step(random.normal_tensor<float, 3>({1, 6, 16}), prefilled);
  const DraftTree tree{{-1, 0, 0, 1}};
  const auto drafts = random.normal_tensor<float, 3>({1, tree.size(), 16});
  auto tree_cache = prefilled;
  const Tensor<float, 3> y = mha.step_tree(drafts, tree_cache, tree);
  auto path_cache = prefilled;
  Tensor<float, 3> last;
  for (Index draft : tree.path_to(3)) last = mha.step(row(drafts, draft), path_cache);
  EXPECT_TRUE(all_close(row(y, 3), last, 1e-5));
}

TYPED_TEST(DraftTreeTest, BadTreesPathsAndCachesAreNamedAndChangeNothing) {
  using T = TypeParam;
  Random random(84);
  const MultiHeadAttention<T> mha = make_module<T>(module_cases[2], random);
  KVCache<T> cache = prefilled_cache(mha, 16, random);
  const Tensor<T, 4> keys(cache.keys()), values(cache.values());
  const auto lengths = cache.lengths(), positions = cache.positions();
  const auto check_unchanged = [&] {
    EXPECT_EQ(cache.lengths(), lengths);
    EXPECT_EQ(cache.positions(), positions);
    EXPECT_TRUE(all_close(cache.keys(), keys, 0.0));
    EXPECT_TRUE(all_close(cache.values(), values, 0.0));
  };
  const auto drafts = random.normal_tensor<T, 3>({2, 3, 16});
  expect_error<std::invalid_argument>(
      [&] {
        mha.step_tree(drafts, cache, DraftTree{{-1, 2, 0}});
      },
      {"[MultiHeadAttention::step_tree] parents", "parents[1]", "got 2"});
  check_unchanged();
  expect_error<std::invalid_argument>(
      [&] {
        mha.step_tree(drafts, cache, DraftTree{{-1, 0, 2}});
      },
      {"parents[2]", "got 2"});
  check_unchanged();
  expect_error<std::invalid_argument>([&] { mha.step_tree(drafts, cache, DraftTree{{-2, 0, 0}}); }, {"parents[0]"});
  check_unchanged();
  expect_error<ShapeError>([&] { mha.step_tree(drafts, cache, DraftTree::chain(2)); }, {"x_draft", "(2, 2, 16)"});
  check_unchanged();

  MultiHeadAttentionConfig alibi_config = ModuleConfig(16, 2).with_alibi(true);
  const MultiHeadAttention<T> alibi(alibi_config);
  auto alibi_cache = alibi.make_cache(2);
  expect_error<std::invalid_argument>([&] { alibi.step_tree(drafts, alibi_cache, DraftTree::chain(3)); },
                                      {"cfg.alibi"});
  auto windowed = mha.make_cache(2, CachePolicy::sliding_window(8));
  expect_error<std::invalid_argument>([&] { mha.step_tree(drafts, windowed, DraftTree::chain(3)); },
                                      {"step_tree] cache", "evicts"});
  EXPECT_EQ(windowed.length(), 0);

  // keep_draft_path: after a tree of 3 drafts on sequence 0 (5 cached tokens), drafts [0, 3) after slot 5.
  mha.step_tree(drafts, cache, DraftTree{{-1, 0, 0}});
  const auto after_lengths = cache.lengths();
  expect_error<std::invalid_argument>([&] { cache.keep_draft_path(0, 5, {0, 0}); }, {"path", "path[1] = 0"});
  expect_error<std::invalid_argument>([&] { cache.keep_draft_path(0, 5, {2, 1}); }, {"path", "path[1] = 1"});
  expect_error<std::invalid_argument>([&] { cache.keep_draft_path(0, 5, {0, 3}); }, {"path", "[0, 3)"});
  expect_error<std::invalid_argument>([&] { cache.keep_draft_path(0, 9, {}); }, {"draft_start", "[0, 8]"});
  expect_error<std::invalid_argument>([&] { cache.keep_draft_path(2, 5, {}); }, {"b"});
  EXPECT_EQ(cache.lengths(), after_lengths);
  expect_error<std::invalid_argument>([&] { windowed.keep_draft_path(0, 0, {}); }, {"policy"});
}

}  // namespace
}  // namespace selfattn::test
