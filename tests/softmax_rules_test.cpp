// The softmax rules of docs/numerics.md (detail/softmax.hpp) through every kernel path that computes attention:
// the reference kernel, the fused kernel, the decode kernel's general, grouped and streaming paths (each forced),
// the public dispatch with Kernel::decode, and merge_attention_partials. Expected values come from the
// brute-force long-double transcription of the semantics (tests/support/brute_force.hpp), which shares no code
// with the kernels.
//
//   - A row with no allowed key gives output 0 (exactly), lse = -inf, never NaN; whatever makes it empty (key
//     length 0, a bottom-right diagonal before the first key, an `allowed` row of false).
//   - A NaN score at an allowed key makes its row NaN (output and lse), also when masked keys follow it in the
//     row (the row maximum may drop the NaN; the sum carries it) and when it sits in another chunk than the
//     row's maximum; every other row is unchanged.
#include <selfattn/selfattn.hpp>

#include "support/brute_force.hpp"
#include "support/compare.hpp"
#include "support/random.hpp"
#include "support/scalars.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

namespace selfattn::test {
namespace {

using detail::DecodePath;

SELFATTN_SCALAR_TEST_SUITE(SoftmaxRulesTest);

template <typename T>
constexpr T minus_infinity = -std::numeric_limits<T>::infinity();

// Every way a forward result is computed.
enum class Path { reference, fused, decode_general, decode_grouped, decode_streaming, dispatch_decode };
const std::vector<Path> paths = {Path::reference,      Path::fused,           Path::decode_general,
                                 Path::decode_grouped, Path::decode_streaming, Path::dispatch_decode};

std::string path_name(Path path) {
  switch (path) {
    case Path::reference: return "reference kernel";
    case Path::fused: return "fused kernel";
    case Path::decode_general: return "decode kernel, general path";
    case Path::decode_grouped: return "decode kernel, grouped path";
    case Path::decode_streaming: return "decode kernel, streaming path";
    case Path::dispatch_decode: return "sdpa_forward with Kernel::decode";
  }
  return "?";
}

template <typename T>
struct Result {
  Tensor<T, 4> out;
  Tensor<T, 3> lse;
};

// Runs `path` on q, k, v with `opts`; the outputs start as NaN so that an element left unwritten shows.
template <typename T>
Result<T> run(Path path, const Tensor<T, 4>& q, const Tensor<T, 4>& k, const Tensor<T, 4>& v,
              const AttentionOptions<T>& opts) {
  if (path == Path::dispatch_decode) {
    AttentionOptions<T> decode = opts;
    decode.kernel = Kernel::decode;
    auto fwd = sdpa_forward(q, k, v, decode);
    return {std::move(fwd.out), std::move(fwd.lse)};
  }
  Result<T> r{Tensor<T, 4>({q.dim(0), q.dim(1), q.dim(2), v.dim(3)}), Tensor<T, 3>({q.dim(0), q.dim(1), q.dim(2)})};
  r.out.fill(std::numeric_limits<T>::quiet_NaN());
  r.lse.fill(std::numeric_limits<T>::quiet_NaN());
  const auto params = detail::make_params<T>(q, k, v, opts);
  const detail::ForwardOutputs<T> outputs{r.out.view(), r.lse.view(), {}};
  switch (path) {
    case Path::reference: detail::reference_forward(params, outputs); break;
    case Path::fused: detail::fused_forward(params, outputs); break;
    case Path::decode_general: detail::decode_forward(params, outputs, DecodePath::general); break;
    case Path::decode_grouped: detail::decode_forward(params, outputs, DecodePath::grouped); break;
    case Path::decode_streaming: detail::decode_forward(params, outputs, DecodePath::streaming); break;
    case Path::dispatch_decode: break;
  }
  return r;
}

// Whether query row (b, h, i) has no allowed key under opts (the brute force's own mask predicate).
template <typename T>
bool row_is_empty(const AttentionOptions<T>& opts, Index b, Index h, Index i, Index q_len, Index k_len) {
  for (Index j = 0; j < k_len; ++j)
    if (test::brute_force_allowed(opts, b, h, i, j, q_len, k_len)) return false;
  return true;
}

// The fully-masked-row rule on one call: every empty row exactly 0 with lse = -inf, every other row as the brute
// force has it, no NaN anywhere. Returns how many rows were empty.
template <typename T>
Index check_empty_rows(Path path, const Tensor<T, 4>& q, const Tensor<T, 4>& k, const Tensor<T, 4>& v,
                       const AttentionOptions<T>& opts) {
  const Result<T> r = run(path, q, k, v, opts);
  const auto expected = test::brute_force_attention<T>(q, k, v, opts);
  EXPECT_FALSE(test::has_nan(r.out));
  EXPECT_FALSE(test::has_nan(r.lse));
  Index empty = 0;
  for (Index b = 0; b < q.dim(0); ++b)
    for (Index h = 0; h < q.dim(1); ++h)
      for (Index i = 0; i < q.dim(2); ++i) {
        if (!row_is_empty(opts, b, h, i, q.dim(2), k.dim(2))) continue;
        ++empty;
        EXPECT_EQ(r.lse(b, h, i), minus_infinity<T>) << "row " << b << " " << h << " " << i;
        for (Index e = 0; e < v.dim(3); ++e) EXPECT_EQ(r.out(b, h, i, e), T(0)) << "row " << b << " " << h << " " << i;
      }
  EXPECT_TRUE(all_close(r.out, expected.out, default_tolerance<T>()));
  EXPECT_TRUE(all_close(r.lse, expected.lse, default_tolerance<T>()));
  return empty;
}

// G = 2 query heads per key/value head, 3 query rows, keys across two decode chunks (256 keys each).
template <typename T>
struct Problem {
  Tensor<T, 4> q, k, v;
  Problem(Random& random, Index Lq, Index Lk)
      : q(random.normal_tensor<T, 4>({2, 4, Lq, 16})),
        k(random.normal_tensor<T, 4>({2, 2, Lk, 16})),
        v(random.normal_tensor<T, 4>({2, 2, Lk, 12})) {}
};

TYPED_TEST(SoftmaxRulesTest, RowsWithoutKeysGiveZeroAndMinusInfinityOnEveryPath) {
  using T = TypeParam;
  Random random(1001);
  const Problem<T> long_keys(random, 3, 300), one_key(random, 3, 1);

  AttentionOptions<T> zero_length;  // every row of batch 0
  zero_length.key_lengths = {0, 300};
  AttentionOptions<T> before_the_diagonal;  // Lq > Lk: rows 0 and 1 end before key 0
  before_the_diagonal.causal = Causal::bottom_right;
  Tensor<bool, 4> allowed({2, 1, 3, 300});  // row 1 of batch 1 sees nothing; the others see every key
  allowed.fill(true);
  for (Index j = 0; j < 300; ++j) allowed(1, 0, 1, j) = false;
  AttentionOptions<T> false_row;
  false_row.allowed = allowed;

  for (Path path : paths) {
    SCOPED_TRACE(path_name(path));
    EXPECT_EQ(check_empty_rows(path, long_keys.q, long_keys.k, long_keys.v, zero_length), 4 * 3);
    EXPECT_EQ(check_empty_rows(path, one_key.q, one_key.k, one_key.v, before_the_diagonal), 2 * 4 * 2);
    EXPECT_EQ(check_empty_rows(path, long_keys.q, long_keys.k, long_keys.v, false_row), 4);
  }
}

// NaN in keys 0 and 5 of batch 0, key/value head 0: the rows that see them (both query heads of the group) are
// NaN in every column and in lse; the other rows match the brute force. `key_lengths` {1, ...} makes a NaN the
// only allowed key of batch 0 (a maximum may then be -inf or NaN: either way the row is NaN, not empty); {6, ...}
// makes one the last allowed key (masked keys follow it, so a SIMD max may drop it); {Lk, ...} puts allowed
// keys of other chunks after them.
TYPED_TEST(SoftmaxRulesTest, NanAtAnAllowedKeyMakesItsRowNanOnEveryPath) {
  using T = TypeParam;
  Random random(1002);
  Problem<T> problem(random, 3, 600);
  for (Index d = 0; d < 16; ++d) problem.k(0, 0, 0, d) = problem.k(0, 0, 5, d) = std::numeric_limits<T>::quiet_NaN();
  for (const std::vector<Index>& lengths :
       {std::vector<Index>{1, 600}, std::vector<Index>{6, 600}, std::vector<Index>{600, 431}}) {
    SCOPED_TRACE("key lengths " + std::to_string(lengths[0]) + ", " + std::to_string(lengths[1]));
    AttentionOptions<T> opts;
    opts.key_lengths = lengths;
    const auto expected = test::brute_force_attention<T>(problem.q, problem.k, problem.v, opts);
    for (Path path : paths) {
      SCOPED_TRACE(path_name(path));
      const Result<T> r = run(path, problem.q, problem.k, problem.v, opts);
      for (Index b = 0; b < 2; ++b)
        for (Index h = 0; h < 4; ++h)
          for (Index i = 0; i < 3; ++i) {
            const bool sees_nan = b == 0 && h / 2 == 0;
            ASSERT_EQ(std::isnan(expected.lse(b, h, i)), sees_nan) << "the brute force disagrees with the test";
            EXPECT_EQ(std::isnan(r.lse(b, h, i)), sees_nan) << "row " << b << " " << h << " " << i;
            for (Index e = 0; e < 12; ++e) {
              EXPECT_EQ(std::isnan(r.out(b, h, i, e)), sees_nan) << "row " << b << " " << h << " " << i << " column " << e;
              if (!sees_nan) {
                EXPECT_NEAR(r.out(b, h, i, e), expected.out(b, h, i, e), default_tolerance<T>());
              }
            }
            if (!sees_nan) {
              EXPECT_NEAR(r.lse(b, h, i), expected.lse(b, h, i), default_tolerance<T>() * 10);
            }
          }
    }
  }
}

// merge_attention_partials follows the same two rules: a side without keys (lse = -inf) contributes nothing, two
// such sides give 0 and -inf, and a NaN side makes the merged row NaN.
TYPED_TEST(SoftmaxRulesTest, MergeOfPartialsFollowsTheSameRules) {
  using T = TypeParam;
  Random random(1003);
  const Problem<T> problem(random, 3, 40);
  const auto half = [&](const Tensor<T, 4>& x, Index begin) {
    Tensor<T, 4> part({x.dim(0), x.dim(1), 20, x.dim(3)});
    for (Index b = 0; b < x.dim(0); ++b)
      for (Index h = 0; h < x.dim(1); ++h)
        for (Index l = 0; l < 20; ++l)
          for (Index e = 0; e < x.dim(3); ++e) part(b, h, l, e) = x(b, h, begin + l, e);
    return part;
  };
  const Tensor<T, 4> k0 = half(problem.k, 0), k1 = half(problem.k, 20), v0 = half(problem.v, 0), v1 = half(problem.v, 20);
  // Batch 0 sees only the first half (key length 20: the second half's rows are empty); batch 1 sees nothing.
  AttentionOptions<T> whole;
  whole.key_lengths = {20, 0};
  AttentionOptions<T> first = whole, second = whole;
  second.key_lengths = {0, 0};
  const auto a = sdpa_forward(problem.q, k0, v0, first), b = sdpa_forward(problem.q, k1, v1, second);
  const auto merged = merge_attention_partials(a.out, a.lse, b.out, b.lse);
  const auto expected = test::brute_force_attention<T>(problem.q, problem.k, problem.v, whole);
  EXPECT_TRUE(all_close(merged.out, expected.out, default_tolerance<T>()));
  EXPECT_TRUE(all_close(merged.lse, expected.lse, default_tolerance<T>()));
  for (Index h = 0; h < 4; ++h)
    for (Index i = 0; i < 3; ++i) {
      EXPECT_EQ(merged.lse(1, h, i), minus_infinity<T>);
      for (Index e = 0; e < 12; ++e) {
        EXPECT_EQ(merged.out(1, h, i, e), T(0));
        EXPECT_EQ(merged.out(0, h, i, e), a.out(0, h, i, e)) << "an empty side changes nothing";
      }
    }

  // A NaN partial row (on either side) makes the merged row NaN; the other rows are untouched.
  for (const bool nan_on_a : {true, false}) {
    Tensor<T, 4> out_a = a.out, out_b = b.out;
    Tensor<T, 3> lse_a = a.lse, lse_b = b.lse;
    (nan_on_a ? lse_a : lse_b)(0, 2, 1) = std::numeric_limits<T>::quiet_NaN();
    const auto poisoned = merge_attention_partials(out_a, lse_a, out_b, lse_b);
    for (Index h = 0; h < 4; ++h)
      for (Index i = 0; i < 3; ++i) {
        const bool nan_row = h == 2 && i == 1;
        EXPECT_EQ(std::isnan(poisoned.lse(0, h, i)), nan_row) << (nan_on_a ? "a" : "b") << " row " << h << " " << i;
        for (Index e = 0; e < 12; ++e) EXPECT_EQ(std::isnan(poisoned.out(0, h, i, e)), nan_row);
      }
  }
}

}  // namespace
}  // namespace selfattn::test
