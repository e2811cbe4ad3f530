// int8 keys and values with a bfloat16 scale per block of 32 (quantized.hpp), read by the attention kernels:
//
//   - the quantisation rule: |x - x̂| <= s / 2 (1 + 2^-16), s <= absmax / 127 (1 + 2^-7) (+ 2^-133, bfloat16's smallest
//     subnormal, for the tiniest blocks), 127 s >= absmax, over rows of
//     every magnitude float has, lengths that are and are not whole blocks; zero blocks; non-finite blocks;
//   - every decode path (forced) on int8 keys and values gives bit for bit what it gives on their dequantised floats
//     (x̂ = s q is exact in float, so the int8 path may differ from the float path only if it computed differently),
//     over the shared sweep of shapes and mask kinds, GQA included, and over shapes that cross the chunks (256 keys);
//   - calls of more rows than the decode kernel takes (the fused and reference kernels) equal the float call on x̂ too;
//   - a masked key whose block is NaN never reaches the output;
//   - against the float keys and values themselves, each output row within the bound the rule gives
//     (docs/int8_cache.md): (e^(2 Delta) - 1) max |v| + max |v - v̂|, Delta the largest score error the key scales
//     allow;
//   - the cache (KVCache<float, std::int8_t>): under every policy (keep all, growing; a sliding window; attention sinks
//     with RoPE re-rotation) and after draft paths are kept, its rows are exactly quantize_int8 of what a float cache
//     holds; the module's steps over it stay within the rule's reach of the float cache's, GQA included; a whole
//     decoder (TransformerStack) steps over int8 caches in every layer; step_tree over an int8 cache equals one-token
//     steps along each draft's path.
#include <selfattn/attention.hpp>
#include <selfattn/int8_attention.hpp>
#include <selfattn/nn/draft_tree.hpp>
#include <selfattn/nn/multihead.hpp>
#include <selfattn/nn/transformer_stack.hpp>
#include <selfattn/quantized.hpp>

#include "support/compare.hpp"
#include "support/expect_error.hpp"
#include "support/level_copy.hpp"
#include "support/module_config.hpp"
#include "support/random.hpp"
#include "support/sanitizers.hpp"
#include "support/sweep.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace selfattn::test {
namespace {

using detail::DecodePath;

TEST(Int8Quantization, FollowsTheErrorRuleAtEveryMagnitude) {
  Random random(801);
  for (const float magnitude : {1e-40f, 1e-30f, 1e-8f, 1.0f, 3.0f, 1e8f, 1e30f, 3e38f}) {
    for (const Index n : {1, 7, 31, 32, 33, 64, 100, 128}) {
      std::vector<float> x(static_cast<std::size_t>(n));
      for (float& value : x)  // in double: |x| <= magnitude, so that 3e38 stays finite
        value = static_cast<float>(std::clamp(random.normal() / 4.0, -1.0, 1.0) * static_cast<double>(magnitude));
      x[static_cast<std::size_t>(random.integer(0, n - 1))] = magnitude;  // a block at the magnitude itself
      std::vector<std::int8_t> q(x.size());
      std::vector<bfloat16> scales(static_cast<std::size_t>(int8_blocks(n)));
      quantize_int8_row(x.data(), n, q.data(), scales.data());
      for (Index c = 0; c < int8_blocks(n); ++c) {
        double absmax = 0.0;
        for (Index i = c * int8_block; i < std::min(n, (c + 1) * int8_block); ++i)
          absmax = std::max(absmax, std::abs(static_cast<double>(x[static_cast<std::size_t>(i)])));
        const double s = static_cast<float>(scales[static_cast<std::size_t>(c)]);
        EXPECT_GE(127.0 * s, absmax) << "magnitude " << magnitude << " n " << n << " block " << c;
        // 2^-133, the smallest bfloat16: the scales of blocks below 127 * 2^-126 are subnormal, of that granularity
        EXPECT_LE(s, absmax / 127.0 * (1.0 + std::ldexp(1.0, -7)) + std::ldexp(1.0, -133)) << "magnitude " << magnitude;
        for (Index i = c * int8_block; i < std::min(n, (c + 1) * int8_block); ++i) {
          const double error = std::abs(static_cast<double>(x[static_cast<std::size_t>(i)]) -
                                        dequantize_int8(q.data(), scales.data(), i));
          EXPECT_LE(error, s / 2.0 * (1.0 + std::ldexp(1.0, -16))) << "magnitude " << magnitude << " i " << i;
          EXPECT_GE(q[static_cast<std::size_t>(i)], -127);
        }
      }
    }
  }
}

TEST(Int8Quantization, ZeroAndNonFiniteBlocks) {
  std::vector<float> x(96, 0.0f);
  x[40] = 2.0f;
  x[70] = std::numeric_limits<float>::infinity();
  std::vector<std::int8_t> q(96);
  std::vector<bfloat16> scales(3);
  quantize_int8_row(x.data(), 96, q.data(), scales.data());
  EXPECT_EQ(static_cast<float>(scales[0]), 0.0f);  // zeros: scale 0, x̂ = 0
  EXPECT_EQ(dequantize_int8(q.data(), scales.data(), 5), 0.0f);
  const float s = static_cast<float>(scales[1]);  // 2 / 127 rounded up to a bfloat16
  EXPECT_LE(std::abs(dequantize_int8(q.data(), scales.data(), 40) - 2.0f), s / 2);
  EXPECT_TRUE(std::isnan(static_cast<float>(scales[2])));  // an infinity: the block reads back NaN
  EXPECT_TRUE(std::isnan(dequantize_int8(q.data(), scales.data(), 64)));
  x[70] = std::numeric_limits<float>::quiet_NaN();
  quantize_int8_row(x.data(), 96, q.data(), scales.data());
  EXPECT_TRUE(std::isnan(dequantize_int8(q.data(), scales.data(), 95)));
  EXPECT_EQ(dequantize_int8(q.data(), scales.data(), 40), s * q[40]);
}

TEST(Int8Quantization, TensorHelpersRoundTripAndNameTheirErrors) {
  Random random(802);
  const auto x = random.normal_tensor<float, 4>({2, 3, 5, 40});
  const QuantizedTensor x8 = quantize_int8(x.view());
  EXPECT_EQ(x8.scales.shape(), (std::array<Index, 4>{2, 3, 5, 2}));
  const Tensor<float, 4> back = dequantize_int8(x8.values.view(), x8.scales.view());
  for (Index i = 0; i < x.size(); ++i)
    EXPECT_LE(std::abs(x.data()[i] - back.data()[i]), 0.5f * 4.5f / 127.0f * 1.01f);  // |x| < 4.5 for 600 normals
  const Tensor<bfloat16, 4> wrong({2, 3, 5, 1});
  expect_error<ShapeError>([&] { dequantize_int8(x8.values.view(), wrong.view()); }, {"dequantize_int8", "scales"});
}

// One attention call on int8 keys and values: the quantised tensors and the float ones they stand for.
struct Int8Call {
  Tensor<float, 4> q;
  QuantizedTensor k8, v8;
  Tensor<float, 4> k, v;  // x̂: dequantize_int8 of k8, v8
  MaskedOptions<float> masks;
  std::string where;

  detail::AttentionParams<float, std::int8_t> int8_params() const {
    auto p = detail::make_stored_params<float, std::int8_t>(q, k8.values, v8.values, masks.opts);
    p.k_scales = k8.scales;
    p.v_scales = v8.scales;
    return p;
  }
  detail::AttentionParams<float> float_params() const { return detail::make_params<float>(q, k, v, masks.opts); }
};

Int8Call make_call(const Shape& s, MaskKind kind, Random& random) {
  Int8Call c;
  c.q = random.normal_tensor<float, 4>({s.batch, s.heads, s.q_len, s.head_dim});
  // Keys with an outlier channel, as trained models have: the block holding it gets a coarse scale, the others not.
  Tensor<float, 4> k = random.normal_tensor<float, 4>({s.batch, s.kv_heads, s.k_len, s.head_dim});
  for (Index b = 0; b < s.batch; ++b)
    for (Index h = 0; h < s.kv_heads; ++h)
      for (Index j = 0; j < s.k_len; ++j) k(b, h, j, 0) *= 8.0f;
  c.k8 = quantize_int8(k.view());
  c.v8 = quantize_int8(random.normal_tensor<float, 4>({s.batch, s.kv_heads, s.k_len, s.value_dim}).view());
  c.k = dequantize_int8(c.k8.values.view(), c.k8.scales.view());
  c.v = dequantize_int8(c.v8.values.view(), c.v8.scales.view());
  make_options(kind, s, random, c.masks);
  c.where = "B " + std::to_string(s.batch) + " H " + std::to_string(s.heads) + " Hkv " + std::to_string(s.kv_heads) +
            " Lq " + std::to_string(s.q_len) + " Lk " + std::to_string(s.k_len) + " D " + std::to_string(s.head_dim) +
            " Dv " + std::to_string(s.value_dim) + ", mask kind " + std::to_string(static_cast<int>(kind));
  return c;
}

// out and lse of the decode kernel forced onto `path`.
template <typename KV>
std::pair<Tensor<float, 4>, Tensor<float, 3>> decode(const detail::AttentionParams<float, KV>& p, DecodePath path) {
  std::pair<Tensor<float, 4>, Tensor<float, 3>> result{
      Tensor<float, 4>({p.batch(), p.heads(), p.q_len(), p.value_dim()}),
      Tensor<float, 3>({p.batch(), p.heads(), p.q_len()})};
  result.first.fill(std::numeric_limits<float>::quiet_NaN());  // every element must be written
  detail::decode_forward(p, detail::ForwardOutputs<float>{result.first.view(), result.second.view(), {}}, path);
  return result;
}

::testing::AssertionResult bitwise_equal(const float* a, const float* b, Index n) {
  for (Index i = 0; i < n; ++i)
    if (!(a[i] == b[i] || (std::isnan(a[i]) && std::isnan(b[i]))))
      return ::testing::AssertionFailure() << "element " << i << ": " << a[i] << " against " << b[i];
  return ::testing::AssertionSuccess();
}

// The sweep's shapes with few query rows (what the decode kernel takes), and shapes that cross its chunks with GQA.
std::vector<Shape> decode_shapes() {
  std::vector<Shape> result;
  for (Shape s : sweep_shapes) {
    s.q_len = std::min<Index>(s.q_len, 4);
    result.push_back(s);
  }
  result.push_back({1, 8, 2, 1, 530, 64, 64});
  result.push_back({2, 4, 4, 2, 300, 80, 40});
  result.push_back({1, 16, 1, 3, 257, 128, 128});
  result.push_back({1, 2, 2, 1, 513, 40, 17});
  return result;
}

TEST(Int8KvDecode, EveryPathEqualsTheFloatCallOnTheDequantisedValuesBitForBit) {
  Random random(803);
  int compared = 0;
  std::size_t index = 0;
  for (const Shape& s : decode_shapes())
    for (MaskKind kind : mask_kinds) {
      if (!test::sweep_case_runs(index++)) continue;
      const Int8Call c = make_call(s, kind, random);
      for (DecodePath path : {DecodePath::general, DecodePath::grouped, DecodePath::streaming}) {
        SCOPED_TRACE(c.where + ", path " + std::to_string(static_cast<int>(path)));
        const auto int8 = decode(c.int8_params(), path);
        const auto wide = decode(c.float_params(), path);
        EXPECT_TRUE(bitwise_equal(int8.first.data(), wide.first.data(), int8.first.size())) << "out";
        EXPECT_TRUE(bitwise_equal(int8.second.data(), wide.second.data(), int8.second.size())) << "lse";
        ++compared;
      }
    }
  EXPECT_GT(compared, 60);
}

// More query rows than the decode kernel takes: the fused kernel (and the reference, with weights) run on x̂ widened
// into the workspace, and give what the float call on x̂ gives.
TEST(Int8KvDecode, CallsOfManyRowsEqualTheFloatCall) {
  Random random(804);
  for (const Shape& s : {Shape{1, 4, 2, 40, 90, 64, 64}, Shape{2, 2, 1, 17, 33, 59, 17}})
    for (MaskKind kind : {MaskKind::none, MaskKind::causal_bottom_right, MaskKind::everything}) {
      const Int8Call c = make_call(s, kind, random);
      SCOPED_TRACE(c.where);
      for (const bool weights : {false, true}) {
        AttentionOptions<float> opts = c.masks.opts;
        opts.need_weights = weights;
        const auto int8 = sdpa_forward_int8(c.q, c.k8, c.v8, opts);
        const auto wide = sdpa_forward(c.q, c.k, c.v, opts);
        EXPECT_TRUE(bitwise_equal(int8.out.data(), wide.out.data(), wide.out.size()));
        EXPECT_TRUE(bitwise_equal(int8.lse.data(), wide.lse.data(), wide.lse.size()));
        if (weights) {
          EXPECT_TRUE(bitwise_equal(int8.weights.data(), wide.weights.data(), wide.weights.size()));
        }
      }
    }
}

// A key outside a row's mask whose block reads back NaN (an infinity was stored) stays out of every path's output.
TEST(Int8KvDecode, MaskedNonFiniteBlocksDoNotLeak) {
  Random random(805);
  for (DecodePath path : {DecodePath::general, DecodePath::grouped, DecodePath::streaming}) {
    Tensor<float, 4> k = random.normal_tensor<float, 4>({1, 2, 300, 64});
    Tensor<float, 4> v = random.normal_tensor<float, 4>({1, 2, 300, 64});
    k(0, 1, 280, 3) = std::numeric_limits<float>::infinity();
    v(0, 0, 290, 40) = std::numeric_limits<float>::infinity();
    Int8Call c;
    c.q = random.normal_tensor<float, 4>({1, 4, 1, 64});
    c.k8 = quantize_int8(k.view());
    c.v8 = quantize_int8(v.view());
    c.masks.opts.key_lengths = {270};
    const auto result = decode(c.int8_params(), path);
    EXPECT_FALSE(has_nan(result.first)) << "path " << static_cast<int>(path);
    c.masks.opts.key_lengths = {300};  // unmasked, the NaN block reaches the output, as a float NaN would
    EXPECT_TRUE(has_nan(decode(c.int8_params(), path).first)) << "path " << static_cast<int>(path);
  }
}

// The rule's bound for one output row: scores move by at most Delta = scale sum_d |q_d| s_c(d) / 2 over the keys
// (the largest over key rows, whatever the masks: a bound for the visible ones too), so the weights by a factor within
// e^(+-2 Delta), and o moves by at most (e^(2 Delta) - 1) max |v| + max |v - v̂| (plus the float kernels' own rounding).
TEST(Int8KvDecode, OutputsStayWithinTheRuleOfTheFloatKeysAndValues) {
  Random random(806);
  std::size_t index = 0;
  double tightest = 1e30;
  for (const Shape& s : decode_shapes())
    for (MaskKind kind : mask_kinds) {
      if (!test::sweep_case_runs(index++)) continue;
      Int8Call c = make_call(s, kind, random);
      // Against the float keys and values the int8 ones were made from (make_call keeps only x̂): make them again.
      Tensor<float, 4> k = random.normal_tensor<float, 4>({s.batch, s.kv_heads, s.k_len, s.head_dim});
      Tensor<float, 4> v = random.normal_tensor<float, 4>({s.batch, s.kv_heads, s.k_len, s.value_dim});
      c.k8 = quantize_int8(k.view());
      c.v8 = quantize_int8(v.view());
      const auto exact = decode(detail::make_params<float>(c.q, k, v, c.masks.opts), DecodePath::general);
      const auto int8 = decode(c.int8_params(), detail::decode_path(c.int8_params()));
      const float scale = c.int8_params().scale;
      for (Index b = 0; b < s.batch; ++b)
        for (Index h = 0; h < s.heads; ++h) {
          const Index kv = h / (s.heads / s.kv_heads);
          double max_v = 0.0, v_error = 0.0;
          for (Index j = 0; j < s.k_len; ++j) {
            for (Index e = 0; e < s.value_dim; ++e)
              max_v = std::max(max_v, std::abs(static_cast<double>(v(b, kv, j, e))));
            for (Index block = 0; block < int8_blocks(s.value_dim); ++block)
              v_error = std::max(v_error, static_cast<double>(c.v8.scales(b, kv, j, block)) / 2.0);
          }
          for (Index i = 0; i < s.q_len; ++i) {
            // sum_d |q_d| s_c(d) / 2 = sum_c s_c (sum of |q_d| over block c) / 2
            std::vector<double> q_blocks(static_cast<std::size_t>(int8_blocks(s.head_dim)), 0.0);
            for (Index d = 0; d < s.head_dim; ++d)
              q_blocks[static_cast<std::size_t>(d / int8_block)] += std::abs(static_cast<double>(c.q(b, h, i, d)));
            double delta = 0.0;
            for (Index j = 0; j < s.k_len; ++j) {
              double moved = 0.0;
              for (Index block = 0; block < int8_blocks(s.head_dim); ++block)
                moved +=
                    static_cast<double>(c.k8.scales(b, kv, j, block)) * q_blocks[static_cast<std::size_t>(block)] / 2.0;
              delta = std::max(delta, std::abs(static_cast<double>(scale)) * moved);
            }
            const double bound = std::expm1(2.0 * delta) * max_v + v_error + 1e-5 * (1.0 + max_v);
            double error = 0.0;
            for (Index e = 0; e < s.value_dim; ++e)
              error = std::max(error, std::abs(static_cast<double>(int8.first(b, h, i, e)) - exact.first(b, h, i, e)));
            EXPECT_LE(error, bound) << "b " << b << " h " << h << " i " << i;
            if (error > 0.0) tightest = std::min(tightest, bound / error);
          }
        }
    }
  EXPECT_LT(tightest, 100.0);  // the bound is not vacuous: somewhere the error comes within 100x of it
}

// What an int8 cache holds, dequantised, against quantize_int8 of what a float cache given the same tokens holds.
::testing::AssertionResult holds_quantised(const KVCache<float, std::int8_t>& int8, const KVCache<float>& wide) {
  if (int8.lengths() != wide.lengths() || int8.positions() != wide.positions())
    return ::testing::AssertionFailure() << "lengths or positions differ";
  for (Index b = 0; b < int8.batch(); ++b) {
    const Index length = int8.lengths()[static_cast<std::size_t>(b)];
    for (const bool keys : {true, false}) {
      const auto rows = keys ? wide.sequence_keys(b) : wide.sequence_values(b);
      const auto stored = keys ? int8.sequence_keys(b) : int8.sequence_values(b);
      const auto scales = keys ? int8.sequence_key_scales(b) : int8.sequence_value_scales(b);
      const Index D = int8.head_dim();
      std::vector<std::int8_t> q(static_cast<std::size_t>(D));
      std::vector<bfloat16> s(static_cast<std::size_t>(int8_blocks(D)));
      for (Index h = 0; h < int8.kv_heads(); ++h)
        for (Index j = 0; j < length; ++j) {
          quantize_int8_row(&rows(0, h, j, 0), D, q.data(), s.data());
          for (Index d = 0; d < D; ++d)
            if (dequantize_int8(&stored(0, h, j, 0), &scales(0, h, j, 0), d) != dequantize_int8(q.data(), s.data(), d))
              return ::testing::AssertionFailure()
                     << (keys ? "key" : "value") << " (" << b << ", " << h << ", " << j << ", " << d << ")";
        }
    }
  }
  return ::testing::AssertionSuccess();
}

// Steps over an int8 cache and a float cache side by side, token by token, under each policy: the caches' contents
// agree exactly (holds_quantised) and the outputs within a tolerance the rule allows for these sizes (keys and
// values of about unit size: score errors of a few 1e-3); a cache whose scales went astray would be off by far more.
TEST(Int8KvCache, StepsUnderEveryPolicyHoldExactlyTheQuantisedTokens) {
  Random random(807);
  const MultiHeadAttention<float> mha(ModuleConfig(64, 4).kv_heads(2).rope(16), 808);
  for (const CachePolicy& policy : {CachePolicy::keep_all(), CachePolicy::keep_all(40), CachePolicy::sliding_window(9),
                                    CachePolicy::attention_sinks(3, 7)}) {
    SCOPED_TRACE("window " + std::to_string(policy.window) + " sinks " + std::to_string(policy.sink_tokens));
    auto int8 = mha.make_cache<std::int8_t>(2, policy);
    auto wide = mha.make_cache(2, policy);
    const Tensor<float, 3> prompt = random.normal_tensor<float, 3>({2, 5, 64});
    Tensor<float, 3> y8 = mha.step(prompt, int8), y = mha.step(prompt, wide);
    for (int t = 0; t < 30; ++t) {
      EXPECT_TRUE(holds_quantised(int8, wide)) << "token " << t;
      double error = 0.0, size = 0.0;
      for (Index n = 0; n < y.size(); ++n) {
        error = std::max(error, std::abs(static_cast<double>(y8.data()[n] - y.data()[n])));
        size = std::max(size, std::abs(static_cast<double>(y.data()[n])));
      }
      EXPECT_LT(error, 0.03 * size) << "token " << t;
      const Tensor<float, 3> token = random.normal_tensor<float, 3>({2, 1, 64});
      y8 = mha.step(token, int8);
      y = mha.step(token, wide);
    }
    EXPECT_TRUE(holds_quantised(int8, wide));
  }
}

TEST(Int8KvCache, KeepsDraftPathsTruncatesAndCountsItsBytes) {
  Random random(809);
  const MultiHeadAttention<float> mha(ModuleConfig(64, 4).kv_heads(2), 810);
  auto int8 = mha.make_cache<std::int8_t>(1);
  auto wide = mha.make_cache(1);
  const Tensor<float, 3> x = random.normal_tensor<float, 3>({1, 12, 64});
  mha.step(x, int8);
  mha.step(x, wide);
  int8.keep_draft_path(0, 6, {1, 3, 4});
  wide.keep_draft_path(0, 6, {1, 3, 4});
  EXPECT_TRUE(holds_quantised(int8, wide));
  int8.truncate(0, 7);
  wide.truncate(0, 7);
  EXPECT_TRUE(holds_quantised(int8, wide));
  // D = 16: 16 int8 values and one bfloat16 scale per row, keys and values, (1, 2, capacity) rows.
  const auto rows = static_cast<std::size_t>(2 * 2 * int8.capacity());
  EXPECT_EQ(int8.memory_bytes(), rows * (16 + 2));
  EXPECT_EQ(wide.memory_bytes(), rows * 16 * sizeof(float));
  EXPECT_EQ(int8.key_scales().shape(), (std::array<Index, 4>{1, 2, int8.capacity(), 1}));
  EXPECT_EQ(wide.key_scales().size(), 0);
}

// step_tree over an int8 cache (the prefix's and the drafts' rows read through their scales, sliced by over_cached):
// each draft's row equals one-token steps along its path over an int8 cache, as tests/draft_tree_test.cpp checks for
// a float cache; both read the same quantised rows, so they differ only by the merge's rounding.
TEST(Int8KvCache, StepTreeEqualsStepsAlongEachPath) {
  Random random(813);
  const MultiHeadAttention<float> mha(ModuleConfig(64, 4).kv_heads(2).rope(16), 814);
  auto prefilled = mha.make_cache<std::int8_t>(1);
  mha.step(random.normal_tensor<float, 3>({1, 40, 64}), prefilled);
  const DraftTree tree{{-1, 0, 0, 1, -1, 4}};
  const Tensor<float, 3> drafts = random.normal_tensor<float, 3>({1, tree.size(), 64});
  KVCache<float, std::int8_t> tree_cache = prefilled;
  const Tensor<float, 3> y = mha.step_tree(drafts, tree_cache, tree);
  for (Index node = 0; node < tree.size(); ++node) {
    KVCache<float, std::int8_t> path_cache = prefilled;
    Tensor<float, 3> last;
    for (Index draft : tree.path_to(node)) {
      Tensor<float, 3> token({1, 1, 64});
      for (Index e = 0; e < 64; ++e) token(0, 0, e) = drafts(0, draft, e);
      last = mha.step(token, path_cache);
    }
    double error = 0.0, size = 0.0;
    for (Index e = 0; e < 64; ++e) {
      error = std::max(error, std::abs(static_cast<double>(y(0, node, e)) - last(0, 0, e)));
      size = std::max(size, std::abs(static_cast<double>(last(0, 0, e))));
    }
    EXPECT_LE(error, 1e-5 * (1.0 + size)) << "draft " << node;
  }
}

// A whole decoder over int8 caches (TransformerStack::make_cache<std::int8_t>): every layer's cache int8, 18/64 of the
// float caches' bytes at D = 16 (16 values and one bfloat16 scale per row), and the outputs near the float caches'
// step after step (each layer's keys and values quantised; later layers see the earlier ones' slightly moved outputs).
TEST(Int8KvCache, AWholeStackStepsOverInt8Caches) {
  Random random(811);
  TransformerStackConfig cfg;
  cfg.layer = decoder_layer_config(64, 4);
  cfg.layer.attention.num_kv_heads = 2;
  cfg.layer.attention.rope_dim = 16;
  cfg.num_layers = 2;
  cfg.final_norm = true;
  const TransformerStack<float> model(cfg, 812);
  auto int8 = model.make_cache<std::int8_t>(1);
  auto wide = model.make_cache(1);
  Tensor<float, 3> x = random.normal_tensor<float, 3>({1, 6, 64});
  for (int t = 0; t < 12; ++t) {
    const Tensor<float, 3> y8 = model.step(x, int8), y = model.step(x, wide);
    double error = 0.0, size = 0.0;
    for (Index n = 0; n < y.size(); ++n) {
      error = std::max(error, std::abs(static_cast<double>(y8.data()[n] - y.data()[n])));
      size = std::max(size, std::abs(static_cast<double>(y.data()[n])));
    }
    EXPECT_LT(error, 0.03 * size) << "step " << t;
    x = random.normal_tensor<float, 3>({1, 1, 64});
  }
  ASSERT_EQ(int8.layers.size(), 2u);
  EXPECT_EQ(int8.length(), 17);
  EXPECT_EQ(64 * int8.memory_bytes(), 18 * wide.memory_bytes());
}

}  // namespace
}  // namespace selfattn::test
