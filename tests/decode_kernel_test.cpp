// Tests of the decode kernel's grouped path (detail/kernels/decode_grouped.inc, the query rows of a key/value head
// in SIMD lanes) and streaming path (one to a few rows per key/value head, vectorised over D) against the
// reference kernel: random shapes over every group size, head dims that are and are
// not whole packets, 1 to 4 query rows, key counts around the chunk edges, per-batch key lengths, windows,
// ALiBi, strided cache views; masked NaNs that must not leak; empty rows. (Thread counts: threads_test.cpp.)
#include <selfattn/selfattn.hpp>

#include "support/compare.hpp"
#include "support/level_copy.hpp"
#include "support/random.hpp"
#include "support/sanitizers.hpp"
#include "support/scalars.hpp"

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace selfattn::test {
namespace {

using detail::DecodePath;

SELFATTN_SCALAR_TEST_SUITE(DecodeKernelTest);

struct DecodeCase {
  Index B, H, Hkv, Lq, Lk, D, Dv;
  std::vector<Index> key_lengths;  // empty: all Lk
  Causal causal;
  Index window_left;
  bool alibi;

  std::string describe() const {
    std::string text = "B " + std::to_string(B) + " H " + std::to_string(H) + " Hkv " + std::to_string(Hkv) + " Lq " +
                       std::to_string(Lq) + " Lk " + std::to_string(Lk) + " D " + std::to_string(D) + " Dv " +
                       std::to_string(Dv) + " window " + std::to_string(window_left) + (alibi ? " alibi" : "") +
                       (causal == Causal::bottom_right ? " causal" : "") + " lengths";
    for (Index length : key_lengths) text += " " + std::to_string(length);
    return text;
  }
};

// Runs the decode kernel with `kernel` and the reference on the same params; returns whether both agree.
template <typename T>
::testing::AssertionResult matches_reference(const detail::AttentionParams<T>& params, DecodePath kernel) {
  const Index B = params.batch(), H = params.heads(), Lq = params.q_len(), Dv = params.value_dim();
  Tensor<T, 4> out({B, H, Lq, Dv}), expected_out({B, H, Lq, Dv});
  Tensor<T, 3> lse({B, H, Lq}), expected_lse({B, H, Lq});
  out.fill(std::numeric_limits<T>::quiet_NaN());  // every element must be written
  detail::decode_forward(params, detail::ForwardOutputs<T>{out.view(), lse.view(), {}}, kernel);
  detail::reference_forward(params, detail::ForwardOutputs<T>{expected_out.view(), expected_lse.view(), {}});
  if (test::has_nan(out)) return ::testing::AssertionFailure() << "NaN in the output";
  auto same_out = all_close(out, expected_out, default_tolerance<T>());
  if (!same_out) return ::testing::AssertionFailure() << "out: " << same_out.message();
  auto same_lse = all_close(lse, expected_lse, default_tolerance<T>());
  if (!same_lse) return ::testing::AssertionFailure() << "lse: " << same_lse.message();
  return ::testing::AssertionSuccess();
}

// A random decode call with G = `group` query heads per key/value head and head dim `D`: B = 2, Hkv 1 or 2, Lq as
// given (drawn from 1..4 when 0), Lk drawn from `key_counts`, and at random a value dim unlike D, bottom-right
// causal, per-batch key lengths, a window and ALiBi. The draws keep one order, so a seeded sweep stays put.
template <typename T>
struct RandomDecodeCall {
  DecodeCase c;
  Tensor<T, 4> q, k, v;
  AttentionOptions<T> opts;  // params() points into it: keep the call alive while they are used

  RandomDecodeCall(Random& random, Index group, Index D, Index Lq, const std::vector<Index>& key_counts) {
    c.B = 2;
    c.Hkv = random.integer(1, 2);
    c.H = group * c.Hkv;
    c.Lq = Lq > 0 ? Lq : random.integer(1, 4);
    const Index pick = random.integer(0, static_cast<Index>(key_counts.size()) - 1);
    c.Lk = std::max(c.Lq, key_counts[static_cast<std::size_t>(pick)]);
    c.D = D;
    c.Dv = random.bernoulli(0.25) ? D / 2 + 3 : D;
    c.causal = random.bernoulli(0.75) ? Causal::bottom_right : Causal::none;
    c.key_lengths = random.bernoulli(0.5) ? std::vector<Index>{} : std::vector<Index>{c.Lk, random.integer(0, c.Lk)};
    c.window_left = random.bernoulli(0.25) ? random.integer(0, c.Lk) : -1;
    c.alibi = random.bernoulli(0.5);
    q = random.normal_tensor<T, 4>({c.B, c.H, c.Lq, c.D});
    k = random.normal_tensor<T, 4>({c.B, c.Hkv, c.Lk, c.D});
    v = random.normal_tensor<T, 4>({c.B, c.Hkv, c.Lk, c.Dv});
    opts.causal = c.causal;
    opts.key_lengths = c.key_lengths;
    opts.window_left = c.window_left;
    if (c.alibi) opts.alibi_slopes = alibi_slopes<T>(c.H);
  }

  detail::AttentionParams<T> params() const { return detail::make_params<T>(q, k, v, opts); }
};

// The tests below hold both fast paths to each behaviour, in one loop over the paths, each path on shapes of its own
// (its rows per key/value head: the grouped path's SIMD lanes, the streaming path's blocks of 4 rows); a failure
// names its path (SCOPED_TRACE).
const char* path_name(DecodePath path) {
  switch (path) {
    case DecodePath::grouped: return "grouped path";
    case DecodePath::streaming: return "streaming path";
    default: return "general path";
  }
}

// Random cases, each forced onto its path and on the path the rule picks, with key counts around the chunk edges
// (256), per-batch key lengths, bottom-right causal, windows and ALiBi drawn at random, a value dim unlike D now
// and then. Grouped: every group size G = H / Hkv in {1, 2, 4, 8, 16} with every head dim in {8, 64, 80, 128} (80:
// not a whole number of AVX-512 packets; 8: less than one), 1 to 4 query rows drawn. Streaming: G in {1, 2, 3} with
// the same head dims (8 and 80: the scalar tails run) and each of 1 to 4 query rows (up to 12 rows per head: blocks
// of 4 rows).
TYPED_TEST(DecodeKernelTest, FastPathsMatchTheReferenceOverRandomShapes) {
  using T = TypeParam;
  struct Sweep {
    DecodePath path;
    std::uint64_t seed;
    std::vector<Index> groups, query_rows;  // query rows 0: drawn from 1..4 for each case
    std::vector<Index> key_counts;
    int cases, sanitized_cases;  // sanitized: a third of the cases run (test::sweep_case_runs)
  };
  const std::vector<Sweep> sweeps = {
      {DecodePath::grouped, 501, {1, 2, 4, 8, 16}, {0}, {1, 2, 17, 255, 256, 257, 511, 513, 600}, 20, 7},
      {DecodePath::streaming, 511, {1, 2, 3}, {1, 2, 3, 4}, {1, 2, 17, 255, 256, 257, 511, 512, 513, 600}, 48, 16},
  };
  for (const Sweep& sweep : sweeps) {
    SCOPED_TRACE(path_name(sweep.path));
    Random random(sweep.seed);
    int cases = 0;
    std::size_t index = 0;
    for (Index group : sweep.groups)
      for (Index D : {8, 64, 80, 128})
        for (Index Lq : sweep.query_rows) {
          if (!test::sweep_case_runs(index++)) continue;
          const RandomDecodeCall<T> call(random, group, D, Lq, sweep.key_counts);
          const auto params = call.params();
          ASSERT_NE(detail::decode_path(params), DecodePath::general);
          EXPECT_TRUE(matches_reference(params, sweep.path)) << call.c.describe();
          EXPECT_TRUE(matches_reference(params, detail::decode_path(params))) << call.c.describe();
          ++cases;
        }
    EXPECT_EQ(cases, test::sanitized ? sweep.sanitized_cases : sweep.cases);
  }
}

// The benchmark's decode steps, one query row over several chunks with every key visible (the unmasked paths and
// their chunk merge), on the path the rule picks for them and on the general path: grouped, H = 32, Hkv = 2 over
// 1000 keys; streaming, the memory-bound H = Hkv = 8 over 1100 keys (a ragged last chunk).
TYPED_TEST(DecodeKernelTest, BenchmarkDecodeStepsMatchTheReference) {
  using T = TypeParam;
  struct Step {
    DecodePath path;
    std::uint64_t seed;
    Index H, Hkv, Lk;
  };
  for (const Step& s : {Step{DecodePath::grouped, 502, 32, 2, 1000}, Step{DecodePath::streaming, 512, 8, 8, 1100}}) {
    SCOPED_TRACE(path_name(s.path));
    Random random(s.seed);
    const Index D = 128;
    const auto q = random.normal_tensor<T, 4>({1, s.H, 1, D});
    const auto k = random.normal_tensor<T, 4>({1, s.Hkv, s.Lk, D});
    const auto v = random.normal_tensor<T, 4>({1, s.Hkv, s.Lk, D});
    const auto params = detail::make_params<T>(q, k, v, AttentionOptions<T>{});
    EXPECT_EQ(detail::decode_path(params), s.path);
    EXPECT_TRUE(matches_reference(params, s.path));
    EXPECT_TRUE(matches_reference(params, DecodePath::general));
  }
}

// Keys and values as views into a cache with more capacity than length (rows D + 5 apart, planes further
// apart still): each path reads them in place through their strides.
TYPED_TEST(DecodeKernelTest, ReadsStridedCacheViewsInPlace) {
  using T = TypeParam;
  struct Case {
    DecodePath path;
    std::uint64_t seed;
    Index H;
  };
  for (const Case& c : {Case{DecodePath::grouped, 503, 8}, Case{DecodePath::streaming, 513, 6}}) {
    SCOPED_TRACE(path_name(c.path));
    Random random(c.seed);
    const Index B = 2, H = c.H, Hkv = 2, Lq = 2, Lk = 300, capacity = 320, D = 20, row = D + 5;
    const auto q = random.normal_tensor<T, 4>({B, H, Lq, D});
    auto storage_k = random.normal_tensor<T, 4>({B, Hkv, capacity, row});
    auto storage_v = random.normal_tensor<T, 4>({B, Hkv, capacity, row});
    const std::array<Index, 4> shape{B, Hkv, Lk, D};
    const TensorView<const T, 4> k(storage_k.data(), shape, storage_k.strides());
    const TensorView<const T, 4> v(storage_v.data(), shape, storage_v.strides());
    AttentionOptions<T> opts;
    opts.causal = Causal::bottom_right;
    opts.key_lengths = {Lk, 123};
    opts.alibi_slopes = alibi_slopes<T>(H);
    EXPECT_TRUE(matches_reference(detail::make_params<T>(q.view(), k, v, opts), c.path));
  }
}

// NaN in keys and values the mask hides (past a batch's key length, past the causal diagonal, before the
// window) must not reach the output: masked scores are selected to -inf and their products skipped. The one row
// that sees a NaN key gets NaN (out and lse), as in the reference. Grouped: G = 16 without ALiBi; streaming: G = 3
// with ALiBi, 3 query rows (9 rows per head: blocks of 4, 4 and 1), a head dim of 80 (scalar tails).
TYPED_TEST(DecodeKernelTest, MaskedNaNKeysAndValuesDoNotLeak) {
  using T = TypeParam;
  struct Case {
    DecodePath path;
    std::uint64_t seed;
    Index H, D;
    bool alibi;
  };
  for (const Case& c : {Case{DecodePath::grouped, 504, 16, 64, false}, Case{DecodePath::streaming, 514, 3, 80, true}}) {
    SCOPED_TRACE(path_name(c.path));
    Random random(c.seed);
    const Index B = 2, H = c.H, Hkv = 1, Lq = 3, Lk = 600, D = c.D;
    const T nan = std::numeric_limits<T>::quiet_NaN();
    const auto q = random.normal_tensor<T, 4>({B, H, Lq, D});
    auto k = random.normal_tensor<T, 4>({B, Hkv, Lk, D});
    auto v = random.normal_tensor<T, 4>({B, Hkv, Lk, D});
    AttentionOptions<T> opts;
    opts.causal = Causal::bottom_right;
    opts.key_lengths = {Lk, 300};
    opts.window_left = 400;
    if (c.alibi) opts.alibi_slopes = alibi_slopes<T>(H);
    for (Index d = 0; d < D; ++d) {
      k(0, 0, Lk - 1, d) = v(0, 0, Lk - 1, d) = nan;  // seen only by the last row of batch 0
      k(1, 0, 450, d) = v(1, 0, 450, d) = nan;        // past batch 1's key length
      k(0, 0, 10, d) = v(0, 0, 10, d) = nan;          // before every row's window
    }
    const auto params = detail::make_params<T>(q, k, v, opts);
    Tensor<T, 4> out({B, H, Lq, D}), expected_out({B, H, Lq, D});
    Tensor<T, 3> lse({B, H, Lq}), expected_lse({B, H, Lq});
    detail::decode_forward(params, detail::ForwardOutputs<T>{out.view(), lse.view(), {}}, c.path);
    detail::reference_forward(params, detail::ForwardOutputs<T>{expected_out.view(), expected_lse.view(), {}});
    for (Index h = 0; h < H; ++h)
      for (Index i = 0; i < Lq; ++i) {
        const bool sees_nan = i == Lq - 1;  // the last row of batch 0 sees key Lk - 1
        EXPECT_EQ(std::isnan(lse(0, h, i)), sees_nan) << "h " << h << " i " << i;
        EXPECT_NEAR(lse(1, h, i), expected_lse(1, h, i), default_tolerance<T>()) << "h " << h << " i " << i;
        for (Index d = 0; d < D; ++d) {
          EXPECT_EQ(std::isnan(out(0, h, i, d)), sees_nan) << "h " << h << " i " << i;
          EXPECT_FALSE(std::isnan(out(1, h, i, d))) << "h " << h << " i " << i;
          if (!sees_nan) {
            EXPECT_NEAR(out(0, h, i, d), expected_out(0, h, i, d), default_tolerance<T>());
          }
          EXPECT_NEAR(out(1, h, i, d), expected_out(1, h, i, d), default_tolerance<T>());
        }
      }
  }
}

// A row that sees no key (key length 0, or a window that ends before the first key) gives 0 and lse = -inf.
// Grouped: 4 heads and 2 query rows (8 rows per key/value head); streaming: 2 heads and 1 query row.
TYPED_TEST(DecodeKernelTest, RowsWithoutKeysGiveZeroAndMinusInfinity) {
  using T = TypeParam;
  struct Case {
    DecodePath path;
    std::uint64_t seed;
    Index H, Lq;
  };
  for (const Case& c : {Case{DecodePath::grouped, 505, 4, 2}, Case{DecodePath::streaming, 515, 2, 1}}) {
    SCOPED_TRACE(path_name(c.path));
    Random random(c.seed);
    const Index B = 2, H = c.H, Hkv = 1, Lq = c.Lq, Lk = 270, D = 16;
    const auto q = random.normal_tensor<T, 4>({B, H, Lq, D});
    const auto k = random.normal_tensor<T, 4>({B, Hkv, Lk, D});
    const auto v = random.normal_tensor<T, 4>({B, Hkv, Lk, D});
    AttentionOptions<T> opts;
    opts.key_lengths = {0, Lk};
    const auto params = detail::make_params<T>(q, k, v, opts);
    Tensor<T, 4> out({B, H, Lq, D});
    Tensor<T, 3> lse({B, H, Lq});
    out.fill(T(1));
    detail::decode_forward(params, detail::ForwardOutputs<T>{out.view(), lse.view(), {}}, c.path);
    for (Index h = 0; h < H; ++h)
      for (Index i = 0; i < Lq; ++i) {
        EXPECT_EQ(lse(0, h, i), -std::numeric_limits<T>::infinity());
        EXPECT_TRUE(std::isfinite(lse(1, h, i)));
        for (Index d = 0; d < D; ++d) EXPECT_EQ(out(0, h, i, d), T(0));
      }
    EXPECT_TRUE(matches_reference(params, c.path));
  }
}

// Per-element masks, biases and dropout are not the grouped path's: asked for it anyway, decode_forward runs
// the general path and still matches the reference (dropout aside, which the reference applies identically).
TYPED_TEST(DecodeKernelTest, FallsBackToTheGeneralPathForBiasMaskAndDropout) {
  using T = TypeParam;
  Random random(506);
  const Index B = 1, H = 8, Hkv = 2, Lq = 1, Lk = 300, D = 32;
  const auto q = random.normal_tensor<T, 4>({B, H, Lq, D});
  const auto k = random.normal_tensor<T, 4>({B, Hkv, Lk, D});
  const auto v = random.normal_tensor<T, 4>({B, Hkv, Lk, D});
  const auto bias = random.normal_tensor<T, 4>({1, H, 1, Lk});
  const auto allowed = random.bool_tensor<4>({1, 1, 1, Lk}, 0.7);
  for (int variant = 0; variant < 3; ++variant) {
    AttentionOptions<T> opts;
    if (variant == 0) opts.bias = bias;
    if (variant == 1) opts.allowed = allowed;
    if (variant == 2) opts.dropout_p = T(0.3);
    const auto params = detail::make_params<T>(q, k, v, opts);
    EXPECT_EQ(detail::decode_path(params), DecodePath::general) << "variant " << variant;
    EXPECT_TRUE(matches_reference(params, DecodePath::grouped)) << "variant " << variant;
    EXPECT_TRUE(matches_reference(params, DecodePath::streaming)) << "variant " << variant;
  }
}

}  // namespace
}  // namespace selfattn::test
