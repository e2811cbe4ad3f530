// Tests of kv_cache.hpp, the decode kernel and MultiHeadAttention::step: decoding in pieces equals one
// causal forward, eviction keeps exactly the tokens its policy names, memory stays bounded, partial
// results merge exactly, and a failed step changes nothing.
#include <selfattn/selfattn.hpp>

#include "support/brute_force.hpp"
#include "support/compare.hpp"
#include "support/expect_error.hpp"
#include "support/module_by_hand.hpp"
#include "support/module_config.hpp"
#include "support/random.hpp"
#include "support/sanitizers.hpp"
#include "support/scalars.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

namespace selfattn::test {
namespace {

SELFATTN_SCALAR_TEST_SUITE(KVCacheTest);

// Rows [begin, end) of every batch of x (B, L, E).
template <typename T>
Tensor<T, 3> rows(const Tensor<T, 3>& x, Index begin, Index end) {
  Tensor<T, 3> y({x.dim(0), end - begin, x.dim(2)});
  for (Index b = 0; b < x.dim(0); ++b)
    for (Index l = begin; l < end; ++l)
      for (Index e = 0; e < x.dim(2); ++e) y(b, l - begin, e) = x(b, l, e);
  return y;
}

struct ModuleCase {
  std::string name;
  Index E, H, Hkv, rope_dim;
  RopeStyle style;
  bool alibi, bias;
};

const std::vector<ModuleCase> module_cases = {
    {"plain", 16, 4, 0, 0, RopeStyle::half, false, true},
    {"gqa", 16, 4, 2, 0, RopeStyle::half, false, true},
    {"mqa", 16, 4, 1, 0, RopeStyle::half, false, false},
    {"rope full half", 16, 2, 0, 8, RopeStyle::half, false, true},
    {"rope partial interleaved", 16, 2, 1, 4, RopeStyle::interleaved, false, true},
    {"alibi", 12, 3, 0, 0, RopeStyle::half, true, true},
};

template <typename T>
MultiHeadAttention<T> make_module(const ModuleCase& c, Random& random) {
  MultiHeadAttention<T> mha(
      ModuleConfig(c.E, c.H).kv_heads(c.Hkv).rope(c.rope_dim, c.style).with_alibi(c.alibi).with_bias(c.bias), 11);
  randomize_biases(mha, random);
  return mha;
}

// Feeding the sequence in pieces (1 token at a time, several, a prefill then single tokens) gives the
// rows of one forward with Causal::top_left.
TYPED_TEST(KVCacheTest, StepsInPiecesEqualOneCausalForward) {
  using T = TypeParam;
  Random random(51);
  const std::vector<std::vector<Index>> splits = {{1, 1, 1, 1, 1, 1, 1, 1, 1}, {3, 2, 4}, {6, 1, 1, 1}, {9}};
  for (const ModuleCase& c : module_cases) {
    const MultiHeadAttention<T> mha = make_module<T>(c, random);
    const auto x = random.normal_tensor<T, 3>({2, 9, c.E});
    AttentionOptions<T> causal;
    causal.causal = Causal::top_left;
    const auto expected = mha.forward(x, causal).output;
    for (const auto& split : splits) {
      auto cache = mha.make_cache(2);
      Index at = 0;
      for (Index piece : split) {
        const auto y = mha.step(rows(x, at, at + piece), cache);
        EXPECT_TRUE(all_close(y, rows(expected, at, at + piece), default_tolerance<T>()))
            << c.name << ", piece at " << at << " of " << split.size() << " pieces";
        at += piece;
      }
      EXPECT_EQ(cache.length(), 9);
      EXPECT_EQ(cache.positions(), (std::vector<Index>{9, 9}));
    }
  }
}

// The same steps against an expectation that shares nothing with the module (test::module_by_hand: projections
// by loops, RoPE from its definition, fixed ALiBi slopes, brute-force attention): keep-all in pieces against one
// causal pass over the whole sequence; a sliding window of 4, token by token, against a pass over the tokens it
// keeps (RoPE and ALiBi depend on differences of positions only, so the window's tokens may be renumbered from 0).
TYPED_TEST(KVCacheTest, StepsEqualTheModuleComputedByHand) {
  using T = TypeParam;
  Random random(57);
  const Index L = 9, window = 4;
  for (const ModuleCase& c : module_cases) {
    SCOPED_TRACE(c.name);
    const MultiHeadAttention<T> mha = make_module<T>(c, random);
    const auto x = random.normal_tensor<T, 3>({2, L, c.E});
    AttentionOptions<T> causal;
    causal.causal = Causal::top_left;
    const auto expected = test::module_by_hand(mha, x, x, x, causal);
    auto cache = mha.make_cache(2);
    Index at = 0;
    for (Index piece : {3, 2, 4}) {
      EXPECT_TRUE(all_close(mha.step(rows(x, at, at + piece), cache), rows(expected, at, at + piece),
                            default_tolerance<T>()))
          << "piece at " << at;
      at += piece;
    }
    auto windowed = mha.make_cache(2, CachePolicy::sliding_window(window));
    for (Index t = 0; t < L; ++t) {
      const Index first = std::max<Index>(0, t + 1 - window);
      const auto kept = rows(x, first, t + 1);
      const auto by_hand = test::module_by_hand(mha, kept, kept, kept, causal);
      EXPECT_TRUE(all_close(mha.step(rows(x, t, t + 1), windowed), rows(by_hand, t - first, t - first + 1),
                            default_tolerance<T>()))
          << "token " << t << " under sliding_window(" << window << ")";
    }
  }
}

// Key/value heads are stored once per key/value head: the cache has Hkv planes, not H; plane g holds key/value head
// g (rows [g Dh, (g + 1) Dh) of the key projection), and query head h reads plane h / (H / Hkv). With several
// key/value heads and several query heads per group, a wrong mapping (h % Hkv, or every head on plane 0) changes
// the planes or the output: both are checked against loops (the planes) and test::module_by_hand (the output), on
// a prefill of 20 rows (the fused kernel) and single tokens after it (the decode kernel).
TYPED_TEST(KVCacheTest, GroupedQueryHeadsAreStoredOnce) {
  using T = TypeParam;
  Random random(52);
  const Index E = 24, H = 6, Dh = E / H, prefill = 20, L = prefill + 2;
  for (const Index Hkv : {2, 3}) {
    SCOPED_TRACE("Hkv = " + std::to_string(Hkv));
    const MultiHeadAttention<T> mha =
        make_module<T>({"gqa", E, H, Hkv, 0, RopeStyle::half, false, true}, random);  // no RoPE: keys are projections
    const auto x = random.normal_tensor<T, 3>({1, L, E});
    AttentionOptions<T> causal;
    causal.causal = Causal::top_left;
    const auto expected = test::module_by_hand(mha, x, x, x, causal);
    auto cache = mha.make_cache(1);
    EXPECT_TRUE(all_close(mha.step(rows(x, 0, prefill), cache), rows(expected, 0, prefill), default_tolerance<T>()));
    for (Index t = prefill; t < L; ++t)
      EXPECT_TRUE(all_close(mha.step(rows(x, t, t + 1), cache), rows(expected, t, t + 1), default_tolerance<T>()))
          << "token " << t;
    ASSERT_EQ(cache.keys().dim(1), Hkv);
    EXPECT_EQ(cache.keys().dim(3), Dh);
    EXPECT_GE(cache.capacity(), L);
    const auto& p = mha.params();
    for (Index g = 0; g < Hkv; ++g)
      for (Index l = 0; l < L; ++l)
        for (Index d = 0; d < Dh; ++d) {
          const Index row = g * Dh + d;  // of the key and value projections
          long double key = p.k_bias(row), value = p.v_bias(row);
          for (Index e = 0; e < E; ++e) {
            key += static_cast<long double>(x(0, l, e)) * p.k_weight(row, e);
            value += static_cast<long double>(x(0, l, e)) * p.v_weight(row, e);
          }
          const double tolerance = default_tolerance<T>() * 10;  // relative to the projections, a few units
          EXPECT_NEAR(cache.keys()(0, g, l, d), static_cast<T>(key), tolerance) << "plane " << g << ", token " << l;
          EXPECT_NEAR(cache.values()(0, g, l, d), static_cast<T>(value), tolerance) << "plane " << g << ", token " << l;
        }
  }
}

// Sequences of different lengths decode together (right padding: new_tokens[b] real rows per step).
TYPED_TEST(KVCacheTest, SequencesOfDifferentLengthsDecodeTogether) {
  using T = TypeParam;
  Random random(53);
  const MultiHeadAttention<T> mha = make_module<T>(module_cases[3], random);  // RoPE: positions matter
  const auto a = random.normal_tensor<T, 3>({1, 8, 16});  // sequence 0: 5 prompt tokens + 3 generated
  const auto b = random.normal_tensor<T, 3>({1, 6, 16});  // sequence 1: 3 prompt tokens + 3 generated
  AttentionOptions<T> causal;
  causal.causal = Causal::top_left;
  const auto expected_a = mha.forward(a, causal).output, expected_b = mha.forward(b, causal).output;

  auto cache = mha.make_cache(2);
  Tensor<T, 3> prompt({2, 5, 16});  // sequence 1 right-padded with garbage rows
  for (Index l = 0; l < 5; ++l)
    for (Index e = 0; e < 16; ++e) {
      prompt(0, l, e) = a(0, l, e);
      prompt(1, l, e) = l < 3 ? b(0, l, e) : T(1e3);
    }
  const auto y = mha.step(prompt, cache, {}, {5, 3});
  EXPECT_EQ(cache.lengths(), (std::vector<Index>{5, 3}));
  for (Index l = 0; l < 5; ++l)
    for (Index e = 0; e < 16; ++e) {
      EXPECT_NEAR(y(0, l, e), expected_a(0, l, e), default_tolerance<T>());
      if (l < 3) {
        EXPECT_NEAR(y(1, l, e), expected_b(0, l, e), default_tolerance<T>());
      }
    }
  for (Index t = 0; t < 3; ++t) {
    Tensor<T, 3> next({2, 1, 16});
    for (Index e = 0; e < 16; ++e) {
      next(0, 0, e) = a(0, 5 + t, e);
      next(1, 0, e) = b(0, 3 + t, e);
    }
    const auto z = mha.step(next, cache);
    for (Index e = 0; e < 16; ++e) {
      EXPECT_NEAR(z(0, 0, e), expected_a(0, 5 + t, e), default_tolerance<T>()) << "token " << t;
      EXPECT_NEAR(z(1, 0, e), expected_b(0, 3 + t, e), default_tolerance<T>()) << "token " << t;
    }
  }
  EXPECT_EQ(cache.lengths(), (std::vector<Index>{8, 6}));
}

TYPED_TEST(KVCacheTest, TwoCachesOnOneModuleAreIndependent) {
  using T = TypeParam;
  Random random(54);
  const MultiHeadAttention<T> mha = make_module<T>(module_cases[1], random);
  const auto x = random.normal_tensor<T, 3>({1, 4, 16}), other = random.normal_tensor<T, 3>({1, 6, 16});
  auto first = mha.make_cache(1), second = mha.make_cache(1);
  const auto alone = mha.step(x, first);
  mha.step(other, second);
  auto fresh = mha.make_cache(1);
  EXPECT_TRUE(all_close(mha.step(x, fresh), alone, 0.0));
  const auto next = random.normal_tensor<T, 3>({1, 1, 16});
  EXPECT_TRUE(all_close(mha.step(next, first), mha.step(next, fresh), 0.0));
  EXPECT_EQ(second.length(), 6);
}

// Options in step refer to the cache after the append; step is always bottom-right causal.
TYPED_TEST(KVCacheTest, MasksReferToTheCacheAfterTheAppend) {
  using T = TypeParam;
  Random random(55);
  const MultiHeadAttention<T> mha = make_module<T>(module_cases[0], random);
  const auto x = random.normal_tensor<T, 3>({1, 7, 16});
  Tensor<bool, 4> allowed({1, 1, 7, 7});
  for (Index i = 0; i < 7; ++i)
    for (Index j = 0; j < 7; ++j) allowed(0, 0, i, j) = (i + j) % 3 != 1 || i == j;
  AttentionOptions<T> full;
  full.causal = Causal::top_left;
  full.allowed = allowed;
  const auto expected = mha.forward(x, full).output;
  auto cache = mha.make_cache(1);
  mha.step(rows(x, 0, 4), cache, [&] {
    AttentionOptions<T> o;
    o.allowed = TensorView<const bool, 4>(allowed.data(), {1, 1, 4, 4}, {49, 49, 7, 1});
    o.causal = Causal::none;  // ignored: step is causal
    return o;
  }());
  const TensorView<const bool, 4> last_rows(allowed.data() + 4 * 7, {1, 1, 3, 7}, {49, 49, 7, 1});
  AttentionOptions<T> o;
  o.allowed = last_rows;
  EXPECT_TRUE(all_close(mha.step(rows(x, 4, 7), cache, o), rows(expected, 4, 7), default_tolerance<T>()));
}

// ---- eviction ----------------------------------------------------------------------------------------

// Under sinks S and window W, the output for token t is that of one forward over the kept tokens
// (the first S, then the last W up to t), renumbered from 0: positions within the cache.
TYPED_TEST(KVCacheTest, EvictionKeepsSinksAndWindowWithPositionsWithinTheCache) {
  using T = TypeParam;
  Random random(56);
  const Index total = 23;
  struct Policy {
    Index sinks, window;
  };
  for (const ModuleCase& c : {module_cases[0], module_cases[3], module_cases[4], module_cases[5]})
    for (const Policy policy : {Policy{0, 5}, Policy{2, 6}, Policy{4, 1}}) {
      SCOPED_TRACE(c.name + ", sinks " + std::to_string(policy.sinks) + ", window " + std::to_string(policy.window));
      const MultiHeadAttention<T> mha = make_module<T>(c, random);
      const auto x = random.normal_tensor<T, 3>({1, total, c.E});
      auto cache = mha.make_cache(
          1, policy.sinks ? CachePolicy::attention_sinks(policy.sinks, policy.window) : CachePolicy::sliding_window(policy.window));
      const auto prefill = mha.step(rows(x, 0, 9), cache);  // several rows in one step: each sees its own window
      std::vector<Tensor<T, 3>> outputs;
      for (Index t = 0; t < 9; ++t) outputs.push_back(rows(prefill, t, t + 1));
      for (Index t = 9; t < total; ++t) outputs.push_back(mha.step(rows(x, t, t + 1), cache));
      for (Index t = 0; t < total; ++t) {
        std::vector<Index> kept;
        for (Index j = 0; j <= t; ++j)
          if (j < policy.sinks || j > t - policy.window) kept.push_back(j);
        Tensor<T, 3> kept_x({1, static_cast<Index>(kept.size()), c.E});
        for (std::size_t n = 0; n < kept.size(); ++n)
          for (Index e = 0; e < c.E; ++e) kept_x(0, static_cast<Index>(n), e) = x(0, kept[n], e);
        AttentionOptions<T> causal;
        causal.causal = Causal::top_left;
        const auto expected = mha.forward(kept_x, causal).output;
        EXPECT_TRUE(all_close(outputs[static_cast<std::size_t>(t)], rows(expected, expected.dim(1) - 1, expected.dim(1)),
                              10 * default_tolerance<T>()))
            << "token " << t;
      }
      EXPECT_EQ(cache.length(), policy.sinks + policy.window);
      EXPECT_EQ(cache.positions()[0], total);
    }
}

// Memory stays flat under an evicting policy, however long the stream.
TEST(KVCacheMemory, BoundedOverALongStream) {
  Random random(57);
  const MultiHeadAttention<float> mha(ModuleConfig(4, 1).rope(4), 1);
  auto cache = mha.make_cache(1, CachePolicy::attention_sinks(4, 16));
  Tensor<float, 3> token({1, 1, 4});
  std::size_t bytes_after_warmup = 0;
  const Index stream = test::sweep_cases(100000);  // 25,000 under a sanitizer
  Tensor<float, 3> kept({1, 20, 4}), last;  // the 4 sinks and the last 16 tokens, in order
  for (Index t = 0; t < stream; ++t) {
    for (Index e = 0; e < 4; ++e) token(0, 0, e) = static_cast<float>(random.normal());
    last = mha.step(token, cache);
    ASSERT_FALSE(test::has_nan(last));
    if (t == 100) bytes_after_warmup = cache.memory_bytes();
    const Index slot = t < 4 ? t : 4 + (t - 4) % 16;
    for (Index e = 0; e < 4; ++e) kept(0, slot, e) = token(0, 0, e);
  }
  // No drift after 100k evictions: the last output is one forward over the kept tokens in cache order.
  Tensor<float, 3> ordered({1, 20, 4});
  for (Index n = 0; n < 20; ++n)
    for (Index e = 0; e < 4; ++e)
      ordered(0, n, e) = kept(0, n < 4 ? n : 4 + (stream - 16 + (n - 4) - 4) % 16, e);
  AttentionOptions<float> causal;
  causal.causal = Causal::top_left;
  const auto expected = mha.forward(ordered, causal).output;
  for (Index e = 0; e < 4; ++e) EXPECT_NEAR(last(0, 0, e), expected(0, 19, e), 1e-5f);
  EXPECT_EQ(cache.memory_bytes(), bytes_after_warmup);
  EXPECT_EQ(cache.length(), 20);
  EXPECT_EQ(cache.positions()[0], stream);
  // (4 + 16 + 1) slots of keys and values plus the copies of the 4 sinks' keys, 4 floats each.
  EXPECT_EQ(cache.memory_bytes(), sizeof(float) * 4 * (2 * 21 + 4));
}

TEST(KVCacheMemory, KeepAllGrowsAmortised) {
  const MultiHeadAttention<double> mha(ModuleConfig(4, 1));
  auto cache = mha.make_cache(1);
  Tensor<double, 3> token({1, 1, 4});
  int reallocations = 0;
  Index capacity = cache.capacity();
  for (int t = 0; t < 1000; ++t) {
    mha.step(token, cache);
    if (cache.capacity() != capacity) {
      ++reallocations;
      capacity = cache.capacity();
    }
  }
  EXPECT_EQ(cache.length(), 1000);
  EXPECT_LE(reallocations, 11);  // doubling: log2(1000) + 1
}

// ---- the decode kernel and the merge ------------------------------------------------------------------

// The decode kernel (chunks of keys merged by lse) against the reference over many keys and masks, on each of its
// three paths: the path rule (detail::decode_path, which the kernel's dispatch calls) is asserted for every case,
// so the sweep cannot drift onto one path. Streaming: R = G * Lq = 2 rows per key/value head; grouped: R = 6;
// general: a bias, with and without dropout. Causal bottom-right, key lengths and ALiBi on all three.
TYPED_TEST(KVCacheTest, DecodeKernelMatchesTheReference) {
  using T = TypeParam;
  using detail::DecodePath;
  Random random(58);
  struct Case {
    DecodePath path;
    Index q_len;
    bool bias, dropout;
  };
  const Case cases[] = {{DecodePath::streaming, 1, false, false},
                        {DecodePath::grouped, 3, false, false},
                        {DecodePath::general, 3, true, false},
                        {DecodePath::general, 3, true, true}};
  for (Index k_len : {1, 255, 256, 257, 700})
    for (const Case& c : cases) {
      const Index B = 2, H = 4, Hkv = 2, Lq = c.q_len, D = 16;
      const auto q = random.normal_tensor<T, 4>({B, H, Lq, D});
      const auto k = random.normal_tensor<T, 4>({B, Hkv, k_len, D});
      const auto v = random.normal_tensor<T, 4>({B, Hkv, k_len, D});
      const auto bias = random.normal_tensor<T, 4>({1, H, 1, k_len});
      AttentionOptions<T> opts;
      opts.causal = Causal::bottom_right;
      opts.key_lengths = {k_len, k_len / 2};
      if (c.bias) opts.bias = bias;
      opts.alibi_slopes = {T(0.01), T(0.02), T(0.03), T(0.04)};
      opts.dropout_p = c.dropout ? T(0.25) : T(0);
      const std::string trace = "Lk " + std::to_string(k_len) + " path " + std::to_string(static_cast<int>(c.path)) +
                                " dropout " + std::to_string(c.dropout);
      Tensor<T, 4> out({B, H, Lq, D}), expected_out({B, H, Lq, D});
      Tensor<T, 3> lse({B, H, Lq}), expected_lse({B, H, Lq});
      const auto params = detail::make_params<T>(q, k, v, opts);
      ASSERT_EQ(detail::decode_path(params), c.path) << trace;
      detail::decode_forward(params, detail::ForwardOutputs<T>{out.view(), lse.view(), {}});
      detail::reference_forward(params, detail::ForwardOutputs<T>{expected_out.view(), expected_lse.view(), {}});
      EXPECT_TRUE(all_close(out, expected_out, default_tolerance<T>())) << trace;
      EXPECT_TRUE(all_close(lse, expected_lse, default_tolerance<T>())) << trace;
    }
}

TYPED_TEST(KVCacheTest, MergingAnySplitOfTheKeysEqualsTheUnsplitResult) {
  using T = TypeParam;
  Random random(59);
  const Index B = 2, H = 2, Lq = 4, Lk = 13, D = 5;
  const auto q = random.normal_tensor<T, 4>({B, H, Lq, D});
  const auto k = random.normal_tensor<T, 4>({B, H, Lk, D});
  const auto v = random.normal_tensor<T, 4>({B, H, Lk, D});
  AttentionOptions<T> opts;
  opts.key_lengths = {Lk, 4};  // batch 1: the right part is all padding, an empty partial
  const auto whole = sdpa_forward(q, k, v, opts);
  for (Index split = 0; split <= Lk; ++split) {
    const std::array<Index, 4> left_shape{B, H, split, D}, right_shape{B, H, Lk - split, D};
    const TensorView<const T, 4> k_left(k.data(), left_shape, k.strides()), v_left(v.data(), left_shape, v.strides());
    const TensorView<const T, 4> k_right(k.data() + split * D, right_shape, k.strides());
    const TensorView<const T, 4> v_right(v.data() + split * D, right_shape, v.strides());
    AttentionOptions<T> left_opts, right_opts;
    left_opts.key_lengths = {std::min(Lk, split), std::min<Index>(4, split)};
    right_opts.key_lengths = {Lk - split, std::max<Index>(0, 4 - split)};
    const auto left = sdpa_forward(q, k_left, v_left, left_opts);
    const auto right = sdpa_forward(q, k_right, v_right, right_opts);
    const auto merged = merge_attention_partials(left.out, left.lse, right.out, right.lse);
    EXPECT_TRUE(all_close(merged.out, whole.out, default_tolerance<T>())) << "split at " << split;
    EXPECT_TRUE(all_close(merged.lse, whole.lse, default_tolerance<T>())) << "split at " << split;
    EXPECT_FALSE(test::has_nan(merged.out));
  }
  const Tensor<T, 4> other({B, H, Lq, D + 1});
  expect_error<ShapeError>([&] { merge_attention_partials(whole.out, whole.lse, other, whole.lse); },
                           {"[merge_attention_partials] out_b"});
}

// ---- errors leave the cache as it was ------------------------------------------------------------------

TYPED_TEST(KVCacheTest, FailedStepLeavesTheCacheUnchanged) {
  using T = TypeParam;
  Random random(60);
  const MultiHeadAttention<T> mha = make_module<T>(module_cases[3], random);
  auto cache = mha.make_cache(2, CachePolicy::keep_all(6));
  mha.step(random.normal_tensor<T, 3>({2, 4, 16}), cache);
  const Tensor<T, 4> keys(cache.keys()), values(cache.values());
  const auto lengths = cache.lengths(), positions = cache.positions();
  const auto check_unchanged = [&] {
    EXPECT_EQ(cache.lengths(), lengths);
    EXPECT_EQ(cache.positions(), positions);
    EXPECT_TRUE(all_close(cache.keys(), keys, 0.0));
    EXPECT_TRUE(all_close(cache.values(), values, 0.0));
  };
  expect_error<ShapeError>([&] { mha.step(Tensor<T, 3>({2, 1, 15}), cache); }, {"[MultiHeadAttention::step] x_new"});
  check_unchanged();
  expect_error<ShapeError>([&] { mha.step(Tensor<T, 3>({3, 1, 16}), cache); }, {"x_new", "(2, *, 16)"});
  check_unchanged();
  expect_error<std::invalid_argument>([&] { mha.step(Tensor<T, 3>({2, 3, 16}), cache); }, {"cache", "capacity of 6"});
  check_unchanged();
  expect_error<std::invalid_argument>([&] { mha.step(Tensor<T, 3>({2, 2, 16}), cache, {}, {1, 3}); }, {"new_tokens[1]"});
  check_unchanged();
  AttentionOptions<T> bad;
  bad.key_lengths = {9, 1};
  expect_error<std::invalid_argument>([&] { mha.step(Tensor<T, 3>({2, 1, 16}), cache, bad); }, {"opts.key_lengths[0]"});
  check_unchanged();
  const MultiHeadAttention<T> other = make_module<T>(module_cases[2], random);  // Hkv = 1, Dh = 4
  expect_error<ShapeError>([&] { other.step(Tensor<T, 3>({2, 1, 16}), cache); }, {"cache", "made for"});
  check_unchanged();
  EXPECT_NO_THROW(mha.step(Tensor<T, 3>({2, 2, 16}), cache));  // exactly fills the fixed capacity
  EXPECT_EQ(cache.length(), 6);
}

TEST(KVCacheErrors, BadPoliciesAndCrossAttentionModulesThrow) {
  expect_error<std::invalid_argument>([] { KVCache<float>(1, 1, 4, CachePolicy::sliding_window(0)); }, {"policy.window"});
  expect_error<std::invalid_argument>([] { KVCache<float>(1, 1, 4, CachePolicy{2, -1, 0}); }, {"policy.sink_tokens"});
  expect_error<std::invalid_argument>([] { KVCache<float>(1, 1, 4, CachePolicy{2, 4, 3}); }, {"policy.capacity", "(7)"});
  expect_error<std::invalid_argument>([] { KVCache<float>(1, 0, 4); }, {"kv_heads"});
  MultiHeadAttentionConfig cfg = ModuleConfig(8, 2).input_dims(4, 0);
  const MultiHeadAttention<float> cross(cfg);
  auto cache = cross.make_cache(1);
  expect_error<std::invalid_argument>([&] { cross.step(Tensor<float, 3>({1, 1, 8}), cache); }, {"self-attention"});
  cfg.kdim = 0;
  const MultiHeadAttention<float> mha(cfg);
  auto evicting = mha.make_cache(1, CachePolicy::sliding_window(4));
  const Tensor<bool, 4> mask({1, 1, 1, 1});
  AttentionOptions<float> opts;
  opts.allowed = mask;
  expect_error<std::invalid_argument>([&] { mha.step(Tensor<float, 3>({1, 1, 8}), evicting, opts); },
                                      {"evicting cache policy"});
  EXPECT_EQ(evicting.length(), 0);
}

// ---- size limits: capacities whose bytes would wrap throw std::length_error, before allocating ----------------

// A module of E = 512, 8 heads (Dh = 64): one token slot of keys and values is 2 * 8 * 64 * 4 = 4096 bytes, so the
// cache holds at most (2^63 - 1) / 4096 = 2^51 - 1 tokens. keep_all(2^56) reported memory_bytes() == 0 (the count
// wrapped) and the next step threw a bare std::bad_alloc; at 2^59 a std::length_error from vector::reserve.
TEST(KVCacheSizeLimits, CapacityTooLargeForMemoryThrowsLengthError) {
  const MultiHeadAttention<float> mha(ModuleConfig(512, 8));
  const Index limit = (Index{1} << 51) - 1;
  EXPECT_EQ(mha.make_cache(1).max_capacity(), limit);
  for (const Index capacity : {Index{1} << 56, Index{1} << 59, limit + 1})
    expect_error<std::length_error>([&] { mha.make_cache(1, CachePolicy::keep_all(capacity)); },
                                    {"[KVCache]", "policy.capacity", std::to_string(capacity),
                                     "(1, 8, " + std::to_string(capacity) + ", 64)", std::to_string(limit)});
  // The window's slots are allocated at once: the same limit.
  expect_error<std::length_error>([&] { mha.make_cache(1, CachePolicy::sliding_window(limit)); },
                                  {"[KVCache]", "policy.window", std::to_string(limit)});
  // A growing cache checks each growth: reserve and a step past the limit throw, and the cache stays empty.
  auto cache = mha.make_cache(1);
  expect_error<std::length_error>([&] { cache.reserve(Index{1} << 56); },
                                  {"[KVCache::reserve]", "tokens", "72057594037927936", std::to_string(limit)});
  EXPECT_EQ(cache.capacity(), 0);
  EXPECT_EQ(cache.memory_bytes(), 0u);
}

// Capacity x head size x heads (x batch) overflowing Index itself, and S + W + 1 wrapping.
TEST(KVCacheSizeLimits, ProductsThatWrapIndexThrowLengthError) {
  const Index big = Index{1} << 31;
  // Hkv * D * 2 * sizeof(S) = 2^62 * 16 bytes for one token slot: no capacity fits, not even a growing cache's.
  expect_error<std::length_error>([&] { KVCache<double>(1, big, big); }, {"[KVCache]", "head_dim", "2147483648"});
  // 2^20 heads of 2^20 dims: 2^44 bytes a slot, 2^19 - 1 slots at most; 2^30 (2^74 bytes) wrapped.
  expect_error<std::length_error>(
      [] { KVCache<float>(2, Index{1} << 20, Index{1} << 20, CachePolicy::keep_all(Index{1} << 30)); },
      {"[KVCache]", "policy.capacity", "(2, 1048576, 1073741824, 1048576)", std::to_string((Index{1} << 19) - 1)});
  // Batch 0 still counts as one sequence: its planes' strides multiply the other extents.
  EXPECT_THROW(KVCache<float>(0, big, big), std::length_error);
  const Index max = std::numeric_limits<Index>::max();
  expect_error<std::length_error>([&] { KVCache<float>(1, 1, 4, CachePolicy::sliding_window(max)); },
                                  {"[KVCache]", "policy.window", std::to_string(max)});
  expect_error<std::length_error>([&] { KVCache<float>(1, 1, 4, CachePolicy::attention_sinks(max / 2 + 1, max / 2)); },
                                  {"[KVCache]", "policy.window"});
  // The per-sequence lengths and positions are allocated after the checks (a bad head count with a batch of 2^40
  // asked for 16 TB first), and counted: 2^60 sequences of one bf16 head of dimension 1 fit a slot, not their lengths.
  expect_error<std::invalid_argument>([] { KVCache<float>(Index{1} << 40, 0, 4); }, {"[KVCache]", "kv_heads"});
  expect_error<std::length_error>([] { KVCache<float, bfloat16>(Index{1} << 60, 1, 1); },
                                  {"[KVCache]", "batch", "1152921504606846976"});
  // The sinks' own copies: 8 heads of 2^52 sink keys of 64 floats, 2^63 bytes.
  expect_error<std::length_error>([] { KVCache<float>(1, 8, 64, CachePolicy::attention_sinks(Index{1} << 52, 16)); },
                                  {"[KVCache]", "policy.sink_tokens", "4503599627370496"});
}

// The workspaces' sizes come from the inputs' extents too: the decode partials for a capacity of 2^59 keys
// (what a step reserves for its cache) and a module buffer whose element count wraps.
TEST(KVCacheSizeLimits, WorkspaceSizesThatWrapThrowLengthError) {
  AttentionWorkspace<float> ws;
  expect_error<std::length_error>([&] { ws.reserve_decode(8, 1, Index{1} << 59, 64); },
                                  {"[AttentionWorkspace::reserve_decode]", "keys", "576460752303423488"});
  EXPECT_NO_THROW(ws.reserve_decode(8, 1, 1024, 64));
  std::vector<float> buffer;
  expect_error<std::length_error>(
      [&] { MhaWorkspace<float>::take(buffer, std::array<Index, 3>{Index{1} << 30, Index{1} << 30, 16}); },
      {"[MhaWorkspace]", "shape", "(1073741824, 1073741824, 16)"});
  EXPECT_TRUE(buffer.empty());
}

}  // namespace
}  // namespace selfattn::test
