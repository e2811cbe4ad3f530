// Tests of the decode kernel's grouped path (detail/kernels/decode_grouped.inc, the query rows of a key/value head
// in SIMD lanes) and streaming path (one to a few rows per key/value head, vectorised over D) against the
// reference kernel: random shapes over every group size, head dims that are and are
// not whole packets, 1 to 4 query rows, key counts around the chunk edges, per-batch key lengths, windows,
// ALiBi, strided cache views; masked NaNs that must not leak; empty rows. (Thread counts: threads_test.cpp.)
#include <selfattn/selfattn.hpp>

#include "support/compare.hpp"
#include "support/random.hpp"
#include "support/sanitizers.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

namespace selfattn {
namespace {

using detail::DecodePath;
using test::all_close;
using test::default_tolerance;
using test::Random;

template <typename T>
class DecodeKernelTest : public ::testing::Test {};
using Scalars = ::testing::Types<float, double>;
TYPED_TEST_SUITE(DecodeKernelTest, Scalars, );

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

// Random cases: every group size G = H / Hkv in {1, 2, 4, 8, 16} with every head dim in {8, 64, 80, 128}
// (80: not a whole number of AVX-512 packets; 8: less than one), 1 to 4 query rows, key counts around the
// chunk edges (256), per-batch key lengths, bottom-right causal, windows and ALiBi drawn at random.
TYPED_TEST(DecodeKernelTest, GroupedPathMatchesTheReferenceOverRandomShapes) {
  using T = TypeParam;
  Random random(501);
  const std::vector<Index> key_counts = {1, 2, 17, 255, 256, 257, 511, 513, 600};
  int cases = 0;
  std::size_t index = 0;
  for (Index group : {1, 2, 4, 8, 16})
    for (Index D : {8, 64, 80, 128}) {
      if (!test::sweep_case_runs(index++)) continue;  // a third of the cases under a sanitizer
      const RandomDecodeCall<T> call(random, group, D, 0, key_counts);
      const auto params = call.params();
      ASSERT_NE(detail::decode_path(params), DecodePath::general);
      EXPECT_TRUE(matches_reference(params, DecodePath::grouped)) << call.c.describe();
      EXPECT_TRUE(matches_reference(params, detail::decode_path(params))) << call.c.describe();
      ++cases;
    }
  EXPECT_EQ(cases, test::sanitized ? 7 : 20);
}

// The shape of a decode step in the benchmark (H = 32, Hkv = 2, one query row) over several chunks, every key
// visible: the unmasked path, with the chunk merge, on both the grouped and the general path.
TYPED_TEST(DecodeKernelTest, GroupedQueryDecodeStepMatchesTheReference) {
  using T = TypeParam;
  Random random(502);
  const Index H = 32, Hkv = 2, D = 128, Lk = 1000;
  const auto q = random.normal_tensor<T, 4>({1, H, 1, D});
  const auto k = random.normal_tensor<T, 4>({1, Hkv, Lk, D});
  const auto v = random.normal_tensor<T, 4>({1, Hkv, Lk, D});
  const auto params = detail::make_params<T>(q, k, v, AttentionOptions<T>{});
  EXPECT_TRUE(matches_reference(params, DecodePath::grouped));
  EXPECT_TRUE(matches_reference(params, DecodePath::general));
}

// Keys and values as views into a cache with more capacity than length (rows D + 5 apart, planes further
// apart still): the kernel reads them in place through their strides.
TYPED_TEST(DecodeKernelTest, ReadsStridedCacheViewsInPlace) {
  using T = TypeParam;
  Random random(503);
  const Index B = 2, H = 8, Hkv = 2, Lq = 2, Lk = 300, capacity = 320, D = 20, row = D + 5;
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
  EXPECT_TRUE(matches_reference(detail::make_params<T>(q.view(), k, v, opts), DecodePath::grouped));
}

// NaN in keys and values the mask hides (past a batch's key length, past the causal diagonal, before the
// window) must not reach the output: masked scores are selected to -inf and their products skipped.
TYPED_TEST(DecodeKernelTest, MaskedNaNKeysAndValuesDoNotLeak) {
  using T = TypeParam;
  Random random(504);
  const Index B = 2, H = 16, Hkv = 1, Lq = 3, Lk = 600, D = 64;
  const T nan = std::numeric_limits<T>::quiet_NaN();
  const auto q = random.normal_tensor<T, 4>({B, H, Lq, D});
  auto k = random.normal_tensor<T, 4>({B, Hkv, Lk, D});
  auto v = random.normal_tensor<T, 4>({B, Hkv, Lk, D});
  AttentionOptions<T> opts;
  opts.causal = Causal::bottom_right;
  opts.key_lengths = {Lk, 300};
  opts.window_left = 400;
  for (Index d = 0; d < D; ++d) {
    k(0, 0, Lk - 1, d) = v(0, 0, Lk - 1, d) = nan;  // seen only by the last row of batch 0
    k(1, 0, 450, d) = v(1, 0, 450, d) = nan;        // past batch 1's key length
    k(0, 0, 10, d) = v(0, 0, 10, d) = nan;          // before every row's window
  }
  const auto params = detail::make_params<T>(q, k, v, opts);
  Tensor<T, 4> out({B, H, Lq, D}), expected_out({B, H, Lq, D});
  Tensor<T, 3> lse({B, H, Lq}), expected_lse({B, H, Lq});
  detail::decode_forward(params, detail::ForwardOutputs<T>{out.view(), lse.view(), {}}, DecodePath::grouped);
  detail::reference_forward(params, detail::ForwardOutputs<T>{expected_out.view(), expected_lse.view(), {}});
  for (Index h = 0; h < H; ++h)
    for (Index i = 0; i < Lq; ++i)
      for (Index d = 0; d < D; ++d) {
        // The last row of batch 0 sees key Lk - 1: NaN there, as in the reference; nowhere else.
        const bool sees_nan = i == Lq - 1;
        EXPECT_EQ(std::isnan(out(0, h, i, d)), sees_nan) << "h " << h << " i " << i;
        EXPECT_FALSE(std::isnan(out(1, h, i, d))) << "h " << h << " i " << i;
        if (!sees_nan) {
          EXPECT_NEAR(out(0, h, i, d), expected_out(0, h, i, d), default_tolerance<T>());
        }
        EXPECT_NEAR(out(1, h, i, d), expected_out(1, h, i, d), default_tolerance<T>());
      }
}

// A row that sees no key (key length 0, or a window that ends before the first key) gives 0 and lse = -inf.
TYPED_TEST(DecodeKernelTest, RowsWithoutKeysGiveZeroAndMinusInfinity) {
  using T = TypeParam;
  Random random(505);
  const Index B = 2, H = 4, Hkv = 1, Lq = 2, Lk = 270, D = 16;
  const auto q = random.normal_tensor<T, 4>({B, H, Lq, D});
  const auto k = random.normal_tensor<T, 4>({B, Hkv, Lk, D});
  const auto v = random.normal_tensor<T, 4>({B, Hkv, Lk, D});
  AttentionOptions<T> opts;
  opts.key_lengths = {0, Lk};
  const auto params = detail::make_params<T>(q, k, v, opts);
  Tensor<T, 4> out({B, H, Lq, D});
  Tensor<T, 3> lse({B, H, Lq});
  out.fill(T(1));
  detail::decode_forward(params, detail::ForwardOutputs<T>{out.view(), lse.view(), {}}, DecodePath::grouped);
  for (Index h = 0; h < H; ++h)
    for (Index i = 0; i < Lq; ++i) {
      EXPECT_EQ(lse(0, h, i), -std::numeric_limits<T>::infinity());
      EXPECT_TRUE(std::isfinite(lse(1, h, i)));
      for (Index d = 0; d < D; ++d) EXPECT_EQ(out(0, h, i, d), T(0));
    }
  EXPECT_TRUE(matches_reference(params, DecodePath::grouped));
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

// The streaming path (few rows per key/value head, vectorised over D) over random shapes: G in {1, 2, 3} with
// every head dim in {8, 64, 80, 128} (8 and 80: not whole AVX-512 packets, so the scalar tails run), 1 to 4
// query rows (up to 12 rows per head: blocks of 4 rows), key counts around the chunk edges (256), per-batch key
// lengths, bottom-right causal, windows and ALiBi drawn at random; a value dim unlike D now and then.
TYPED_TEST(DecodeKernelTest, StreamingPathMatchesTheReferenceOverRandomShapes) {
  using T = TypeParam;
  Random random(511);
  const std::vector<Index> key_counts = {1, 2, 17, 255, 256, 257, 511, 512, 513, 600};
  int cases = 0;
  std::size_t index = 0;
  for (Index group : {1, 2, 3})
    for (Index D : {8, 64, 80, 128})
      for (Index Lq = 1; Lq <= 4; ++Lq) {
        if (!test::sweep_case_runs(index++)) continue;  // a third of the cases under a sanitizer
        const RandomDecodeCall<T> call(random, group, D, Lq, key_counts);
        const auto params = call.params();
        ASSERT_NE(detail::decode_path(params), DecodePath::general);
        EXPECT_TRUE(matches_reference(params, DecodePath::streaming)) << call.c.describe();
        EXPECT_TRUE(matches_reference(params, detail::decode_path(params))) << call.c.describe();
        ++cases;
      }
  EXPECT_EQ(cases, test::sanitized ? 16 : 48);
}

// The benchmark's memory-bound shape (H = Hkv = 8, one query row, D = 128) over several chunks, every key
// visible, with a ragged last chunk: the unmasked streaming path and its chunk merge.
TYPED_TEST(DecodeKernelTest, SingleRowDecodeStepMatchesTheReference) {
  using T = TypeParam;
  Random random(512);
  const Index H = 8, Hkv = 8, D = 128, Lk = 1100;
  const auto q = random.normal_tensor<T, 4>({1, H, 1, D});
  const auto k = random.normal_tensor<T, 4>({1, Hkv, Lk, D});
  const auto v = random.normal_tensor<T, 4>({1, Hkv, Lk, D});
  const auto params = detail::make_params<T>(q, k, v, AttentionOptions<T>{});
  EXPECT_TRUE(matches_reference(params, DecodePath::streaming));
  EXPECT_TRUE(matches_reference(params, detail::decode_path(params)));
}

// Strided cache views (rows D + 5 apart, capacity beyond the length) through the streaming path.
TYPED_TEST(DecodeKernelTest, StreamingPathReadsStridedCacheViewsInPlace) {
  using T = TypeParam;
  Random random(513);
  const Index B = 2, H = 6, Hkv = 2, Lq = 2, Lk = 300, capacity = 320, D = 20, row = D + 5;
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
  EXPECT_TRUE(matches_reference(detail::make_params<T>(q.view(), k, v, opts), DecodePath::streaming));
}

// NaN in keys and values the mask hides must not reach the streaming path's output either; the one row that
// sees a NaN key gets NaN, as in the reference. G = 3, 3 query rows (9 rows per head: blocks of 4, 4 and 1).
TYPED_TEST(DecodeKernelTest, StreamingPathDoesNotLeakMaskedNaN) {
  using T = TypeParam;
  Random random(514);
  const Index B = 2, H = 3, Hkv = 1, Lq = 3, Lk = 600, D = 80;
  const T nan = std::numeric_limits<T>::quiet_NaN();
  const auto q = random.normal_tensor<T, 4>({B, H, Lq, D});
  auto k = random.normal_tensor<T, 4>({B, Hkv, Lk, D});
  auto v = random.normal_tensor<T, 4>({B, Hkv, Lk, D});
  AttentionOptions<T> opts;
  opts.causal = Causal::bottom_right;
  opts.key_lengths = {Lk, 300};
  opts.window_left = 400;
  opts.alibi_slopes = alibi_slopes<T>(H);
  for (Index d = 0; d < D; ++d) {
    k(0, 0, Lk - 1, d) = v(0, 0, Lk - 1, d) = nan;  // seen only by the last row of batch 0
    k(1, 0, 450, d) = v(1, 0, 450, d) = nan;        // past batch 1's key length
    k(0, 0, 10, d) = v(0, 0, 10, d) = nan;          // before every row's window
  }
  const auto params = detail::make_params<T>(q, k, v, opts);
  Tensor<T, 4> out({B, H, Lq, D}), expected_out({B, H, Lq, D});
  Tensor<T, 3> lse({B, H, Lq}), expected_lse({B, H, Lq});
  detail::decode_forward(params, detail::ForwardOutputs<T>{out.view(), lse.view(), {}}, DecodePath::streaming);
  detail::reference_forward(params, detail::ForwardOutputs<T>{expected_out.view(), expected_lse.view(), {}});
  for (Index h = 0; h < H; ++h)
    for (Index i = 0; i < Lq; ++i) {
      const bool sees_nan = i == Lq - 1;
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

// Rows that see no key through the streaming path: 0 and lse = -inf.
TYPED_TEST(DecodeKernelTest, StreamingRowsWithoutKeysGiveZeroAndMinusInfinity) {
  using T = TypeParam;
  Random random(515);
  const Index B = 2, H = 2, Hkv = 1, Lq = 1, Lk = 270, D = 16;
  const auto q = random.normal_tensor<T, 4>({B, H, Lq, D});
  const auto k = random.normal_tensor<T, 4>({B, Hkv, Lk, D});
  const auto v = random.normal_tensor<T, 4>({B, Hkv, Lk, D});
  AttentionOptions<T> opts;
  opts.key_lengths = {0, Lk};
  const auto params = detail::make_params<T>(q, k, v, opts);
  Tensor<T, 4> out({B, H, Lq, D});
  Tensor<T, 3> lse({B, H, Lq});
  out.fill(T(1));
  detail::decode_forward(params, detail::ForwardOutputs<T>{out.view(), lse.view(), {}}, DecodePath::streaming);
  for (Index h = 0; h < H; ++h) {
    EXPECT_EQ(lse(0, h, 0), -std::numeric_limits<T>::infinity());
    EXPECT_TRUE(std::isfinite(lse(1, h, 0)));
    for (Index d = 0; d < D; ++d) EXPECT_EQ(out(0, h, 0, d), T(0));
  }
  EXPECT_TRUE(matches_reference(params, DecodePath::streaming));
}

}  // namespace
}  // namespace selfattn
