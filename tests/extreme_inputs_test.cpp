// Extreme and degenerate inputs (issue 6, part 3), each rule of docs/numerics.md tested on every path that
// computes attention: the reference, fused and decode kernels (each asked for through opts.kernel; the decode
// kernel's backward is the fused one), MultiHeadAttention forward/backward and step, in float and double.
//
//   - scores of +-1e4 and a scale of 1e3 in float: finite, and as accurate as a naive same-precision
//     implementation (FlashAttention's rule: error at most 2x the naive one's, both against long double);
//   - a bias of -inf everywhere but one key: the output is that key's value row, the gradients finite;
//   - Lk = 0, B = 0, Lq = 0, Dv = 0, head dim 1;
//   - NaN and inf inside the inputs: exactly which outputs they reach, and that masked positions never do;
//   - aliasing: inputs may alias each other; a destination overlapping its source is rejected.
#include <selfattn/selfattn.hpp>

#include "support/brute_force.hpp"
#include "support/compare.hpp"
#include "support/expect_error.hpp"
#include "support/gradcheck.hpp"
#include "support/module_config.hpp"
#include "support/random.hpp"
#include "support/scalars.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

namespace selfattn::test {
namespace {

SELFATTN_SCALAR_TEST_SUITE(ExtremeInputsTest);

// Every forward kernel of the public dispatch; the decode kernel's backward is the fused one.
const std::vector<Kernel> kernels = {Kernel::reference, Kernel::fused, Kernel::decode};

std::string kernel_name(Kernel kernel) {
  switch (kernel) {
    case Kernel::reference: return "reference kernel";
    case Kernel::fused: return "fused kernel";
    case Kernel::decode: return "decode kernel";
    default: return "automatic choice";
  }
}

template <typename T>
constexpr T inf = std::numeric_limits<T>::infinity();
template <typename T>
constexpr T nan = std::numeric_limits<T>::quiet_NaN();

template <typename T>
AttentionOptions<T> on(Kernel kernel, AttentionOptions<T> opts = {}) {
  opts.kernel = kernel;
  return opts;
}

// ---- element and row predicates -------------------------------------------------------------------

template <typename X>
bool all_finite(const X& x) {
  for (Index n = 0; n < x.size(); ++n)
    if (!std::isfinite(static_cast<double>(x.data()[n]))) return false;
  return true;
}

template <typename X>
bool all_zero(const X& x) {
  for (Index n = 0; n < x.size(); ++n)
    if (x.data()[n] != 0) return false;
  return true;
}

// Row (b, h, i, :) of a rank-4 tensor: all NaN, or all finite.
template <typename T>
bool row_all_nan(const Tensor<T, 4>& x, Index b, Index h, Index i) {
  for (Index d = 0; d < x.dim(3); ++d)
    if (!std::isnan(x(b, h, i, d))) return false;
  return true;
}
template <typename T>
bool row_finite(const Tensor<T, 4>& x, Index b, Index h, Index i) {
  for (Index d = 0; d < x.dim(3); ++d)
    if (!std::isfinite(x(b, h, i, d))) return false;
  return true;
}
// Row (b, h, i, :) of x equals the same row of y bit for bit (0 == -0 aside).
template <typename T>
bool row_equal(const Tensor<T, 4>& x, const Tensor<T, 4>& y, Index b, Index h, Index i) {
  for (Index d = 0; d < x.dim(3); ++d)
    if (!(x(b, h, i, d) == y(b, h, i, d))) return false;
  return true;
}

// Every row (b, h, r) of `after` is all NaN where poisoned(b, h, r), and bit for bit that row of `before` elsewhere.
template <typename T, typename Poisoned>
void expect_nan_rows(const Tensor<T, 4>& after, const Tensor<T, 4>& before, Poisoned&& poisoned) {
  for (Index b = 0; b < after.dim(0); ++b)
    for (Index h = 0; h < after.dim(1); ++h)
      for (Index r = 0; r < after.dim(2); ++r) {
        const bool nan_row = poisoned(b, h, r);
        EXPECT_EQ(row_all_nan(after, b, h, r), nan_row) << b << h << r;
        if (!nan_row) {
          EXPECT_TRUE(row_equal(after, before, b, h, r)) << b << h << r;
        }
      }
}

// ---- a naive implementation in any precision -----------------------------------------------------

// Attention with a scale and an optional full (B, H, Lq, Lk) bias, forward and backward, written as plainly
// as possible in precision R. R = long double is the truth; R = T is the "naive same-precision version" of
// FlashAttention's accuracy rule. A -inf score is a masked pair.
//
// `stored_lse`: the backward recomputes P_ij = exp(s_ij - lse_i) from lse_i rounded to T, as every backward
// that meets the API must (sdpa_backward receives lse in T). With scores of 1e4 in float, that rounding
// (|lse| eps / 2 = 5e-4) is a probability's largest error term, and the naive version has to carry it too.
template <typename R>
struct Naive {
  Tensor<R, 4> out;
  Tensor<R, 3> lse;
  Tensor<R, 4> dq, dk, dv;
};

template <typename R, typename T>
Naive<R> naive_attention(const Tensor<T, 4>& q, const Tensor<T, 4>& k, const Tensor<T, 4>& v, const Tensor<T, 4>& dout,
                         double scale, const Tensor<T, 4>* bias = nullptr, bool stored_lse = false) {
  const Index B = q.dim(0), H = q.dim(1), Lq = q.dim(2), D = q.dim(3), Hkv = k.dim(1), Lk = k.dim(2), Dv = v.dim(3);
  Naive<R> r{Tensor<R, 4>({B, H, Lq, Dv}), Tensor<R, 3>({B, H, Lq}), Tensor<R, 4>(q.shape()), Tensor<R, 4>(k.shape()),
             Tensor<R, 4>(v.shape())};
  const R minus_infinity = -std::numeric_limits<R>::infinity();
  for (Index b = 0; b < B; ++b)
    for (Index h = 0; h < H; ++h) {
      const Index hk = h / (H / Hkv);
      for (Index i = 0; i < Lq; ++i) {
        std::vector<R> s(static_cast<std::size_t>(Lk)), p(static_cast<std::size_t>(Lk));
        R m = minus_infinity;
        for (Index j = 0; j < Lk; ++j) {
          R dot = 0;
          for (Index d = 0; d < D; ++d) dot += static_cast<R>(q(b, h, i, d)) * static_cast<R>(k(b, hk, j, d));
          R score = static_cast<R>(scale) * dot;
          if (bias) score += static_cast<R>((*bias)(b, h, i, j));
          s[static_cast<std::size_t>(j)] = score;
          m = std::max(m, score);
        }
        if (m == minus_infinity) {
          r.lse(b, h, i) = minus_infinity;
          continue;  // no allowed key: out 0, no gradient
        }
        R l = 0;
        for (Index j = 0; j < Lk; ++j) {
          const R e = s[static_cast<std::size_t>(j)] == minus_infinity ? R(0) : std::exp(s[static_cast<std::size_t>(j)] - m);
          p[static_cast<std::size_t>(j)] = e;
          l += e;
        }
        r.lse(b, h, i) = m + std::log(l);
        for (Index j = 0; j < Lk; ++j) p[static_cast<std::size_t>(j)] /= l;
        for (Index j = 0; j < Lk; ++j)
          for (Index d = 0; d < Dv; ++d) r.out(b, h, i, d) += p[static_cast<std::size_t>(j)] * static_cast<R>(v(b, hk, j, d));
        // Backward: dv_j += P_ij dO_i; dP_ij = dO_i . v_j; D_i = dO_i . o_i; dS_ij = P_ij (dP_ij - D_i).
        R d_i = 0;
        for (Index d = 0; d < Dv; ++d) d_i += static_cast<R>(dout(b, h, i, d)) * r.out(b, h, i, d);
        const R lse = stored_lse ? static_cast<R>(static_cast<T>(r.lse(b, h, i))) : r.lse(b, h, i);
        for (Index j = 0; j < Lk; ++j) {
          if (p[static_cast<std::size_t>(j)] == R(0)) continue;
          const R pij = stored_lse ? std::exp(s[static_cast<std::size_t>(j)] - lse) : p[static_cast<std::size_t>(j)];
          R dp = 0;
          for (Index d = 0; d < Dv; ++d) {
            r.dv(b, hk, j, d) += pij * static_cast<R>(dout(b, h, i, d));
            dp += static_cast<R>(dout(b, h, i, d)) * static_cast<R>(v(b, hk, j, d));
          }
          const R ds = pij * (dp - d_i) * static_cast<R>(scale);
          for (Index d = 0; d < D; ++d) {
            r.dq(b, h, i, d) += ds * static_cast<R>(k(b, hk, j, d));
            r.dk(b, hk, j, d) += ds * static_cast<R>(q(b, h, i, d));
          }
        }
      }
    }
  return r;
}

// Largest |x - truth|; infinite when x is not finite where the truth is (or the other way round).
template <typename X, typename R, int Rank>
double max_error(const Tensor<X, Rank>& x, const Tensor<R, Rank>& truth) {
  double worst = 0;
  for (Index n = 0; n < x.size(); ++n) {
    const double a = static_cast<double>(x.data()[n]), e = static_cast<double>(truth.data()[n]);
    if (!std::isfinite(a) || !std::isfinite(e)) {
      if (!(a == e)) return std::numeric_limits<double>::infinity();
      continue;
    }
    worst = std::max(worst, std::abs(a - e));
  }
  return worst;
}

template <typename R, int Rank>
double max_abs(const Tensor<R, Rank>& x) {
  double m = 0;
  for (Index n = 0; n < x.size(); ++n)
    if (std::isfinite(static_cast<double>(x.data()[n]))) m = std::max(m, std::abs(static_cast<double>(x.data()[n])));
  return m;
}

// FlashAttention's accuracy rule: the kernel's error against the truth is at most twice the naive same-precision
// implementation's, plus a few ulps of the result's magnitude (for when the naive one happens to be exact).
template <typename T, typename X, typename R, int Rank>
::testing::AssertionResult within_flash_rule(const char* what, const Tensor<X, Rank>& kernel, const Tensor<X, Rank>& naive,
                                             const Tensor<R, Rank>& truth) {
  const double kernel_error = max_error(kernel, truth), naive_error = max_error(naive, truth);
  const double slack = 4 * std::numeric_limits<T>::epsilon() * std::max(1.0, max_abs(truth));
  if (kernel_error <= 2 * naive_error + slack)
    return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": error " << kernel_error << " > 2 x naive " << naive_error << " + "
                                       << slack;
}

// ---- 1. large scores ------------------------------------------------------------------------------

// Scores up to +-1e4, with a scale of 1e3 (q and k of order 1): keys come in near-identical pairs, so most
// rows split their weight between two keys whose scores differ by O(1) although both are O(1e4) — the case
// where float's rounding of the scores shows. Rescaled so that the largest |score| is 1e4.
template <typename T>
struct LargeScoreCase {
  Tensor<T, 4> q, k, v, dout, bias;
  T scale;
};

template <typename T>
LargeScoreCase<T> large_scale_case(Random& random) {
  LargeScoreCase<T> c;
  const Index B = 2, H = 2, Hkv = 1, Lq = 37, Lk = 70, D = 8, Dv = 5;
  c.scale = T(1e3);
  c.q = random.uniform_tensor<T, 4>({B, H, Lq, D});
  c.k = random.uniform_tensor<T, 4>({B, Hkv, Lk, D});
  for (Index b = 0; b < B; ++b)
    for (Index j = 1; j < Lk; j += 2)
      for (Index d = 0; d < D; ++d) c.k(b, 0, j, d) = c.k(b, 0, j - 1, d) + static_cast<T>(1e-3 * random.uniform(-1, 1));
  double largest = 0;
  for (Index b = 0; b < B; ++b)
    for (Index h = 0; h < H; ++h)
      for (Index i = 0; i < Lq; ++i)
        for (Index j = 0; j < Lk; ++j) {
          double dot = 0;
          for (Index d = 0; d < D; ++d) dot += static_cast<double>(c.q(b, h, i, d)) * static_cast<double>(c.k(b, 0, j, d));
          largest = std::max(largest, std::abs(1e3 * dot));
        }
  for (Index n = 0; n < c.q.size(); ++n) c.q.data()[n] = static_cast<T>(c.q.data()[n] * (1e4 / largest));
  c.v = random.normal_tensor<T, 4>({B, Hkv, Lk, Dv});
  c.dout = random.normal_tensor<T, 4>({B, H, Lq, Dv});
  return c;
}

// Ordinary q and k, and a bias of +-1e4 (plus noise of a few units) on every entry: rows choose among the keys
// whose bias is +1e4; one row where every bias is -1e4 (a finite sentinel, hence ordinary scores).
template <typename T>
LargeScoreCase<T> large_bias_case(Random& random) {
  LargeScoreCase<T> c;
  const Index B = 1, H = 3, Lq = 29, Lk = 67, D = 16, Dv = 16;
  c.scale = T(0.25);
  c.q = random.normal_tensor<T, 4>({B, H, Lq, D});
  c.k = random.normal_tensor<T, 4>({B, H, Lk, D});
  c.v = random.normal_tensor<T, 4>({B, H, Lk, Dv});
  c.dout = random.normal_tensor<T, 4>({B, H, Lq, Dv});
  c.bias = Tensor<T, 4>({B, H, Lq, Lk});
  for (Index n = 0; n < c.bias.size(); ++n)
    c.bias.data()[n] = static_cast<T>((random.bernoulli(0.1) ? 1e4 : -1e4) + random.uniform(-3, 3));
  for (Index j = 0; j < Lk; ++j) c.bias(0, 1, 5, j) = T(-1e4);
  return c;
}

template <typename T>
void check_large_scores(const LargeScoreCase<T>& c) {
  const Tensor<T, 4>* bias = c.bias.data() ? &c.bias : nullptr;
  const auto truth = naive_attention<long double>(c.q, c.k, c.v, c.dout, static_cast<double>(c.scale), bias);
  const auto naive = naive_attention<T>(c.q, c.k, c.v, c.dout, static_cast<double>(c.scale), bias, true);
  ASSERT_TRUE(all_finite(truth.out) && all_finite(truth.lse) && all_finite(truth.dq));
  AttentionOptions<T> opts;
  opts.scale = c.scale;
  if (bias) opts.bias = c.bias;
  for (Kernel kernel : kernels) {
    SCOPED_TRACE(kernel_name(kernel));
    const auto fwd = sdpa_forward(c.q, c.k, c.v, on(kernel, opts));
    const auto g = sdpa_backward(c.q, c.k, c.v, fwd.out, fwd.lse, c.dout, on(kernel, opts));
    for (const Tensor<T, 4>* x : {&fwd.out, &g.dq, &g.dk, &g.dv}) EXPECT_TRUE(all_finite(*x));
    EXPECT_TRUE(all_finite(fwd.lse));
    EXPECT_TRUE(within_flash_rule<T>("out", fwd.out, naive.out, truth.out));
    EXPECT_TRUE(within_flash_rule<T>("lse", fwd.lse, naive.lse, truth.lse));
    EXPECT_TRUE(within_flash_rule<T>("dq", g.dq, naive.dq, truth.dq));
    EXPECT_TRUE(within_flash_rule<T>("dk", g.dk, naive.dk, truth.dk));
    EXPECT_TRUE(within_flash_rule<T>("dv", g.dv, naive.dv, truth.dv));
  }
}

TYPED_TEST(ExtremeInputsTest, ScoresOfTenThousandWithScaleThousandAreFiniteAndAsAccurateAsNaive) {
  Random random(601);
  check_large_scores(large_scale_case<TypeParam>(random));
}

TYPED_TEST(ExtremeInputsTest, BiasOfPlusMinusTenThousandIsFiniteAndAsAccurateAsNaive) {
  Random random(602);
  check_large_scores(large_bias_case<TypeParam>(random));
}

// Scores of order 1e4 through the module: its q projection scaled up. In float a score S carries a rounding
// error of a few S * eps (through two projections and a dot product), and a probability's relative error is the
// score's absolute error, so outputs may differ from the double module by about S * eps relative to their
// size: the test allows 64 S eps (S = 1e4: 7.6e-3 in float, 1.4e-11 in double). forward, backward and step.
TYPED_TEST(ExtremeInputsTest, LargeScoresThroughTheModuleForwardBackwardAndStep) {
  using T = TypeParam;
  Random random(603);
  MultiHeadAttentionConfig cfg = ModuleConfig(16, 2);
  MultiHeadAttention<double> truth(cfg, 7);
  const Index B = 2, L = 21;
  const auto x = random.normal_tensor<double, 3>({B, L, 16});
  // Largest |score| for a trial q scale, then rescale W_q so that it is 1e4.
  AttentionOptions<double> weights_opts;
  weights_opts.need_weights = true;
  const auto max_score = [&] {
    const auto f = truth.forward(x, weights_opts);
    const Tensor<double, 4>& q = f.heads->q;
    const Tensor<double, 4>& k = f.heads->k;
    double m = 0;
    for (Index b = 0; b < B; ++b)
      for (Index h = 0; h < 2; ++h)
        for (Index i = 0; i < L; ++i)
          for (Index j = 0; j < L; ++j) {
            double dot = 0;
            for (Index d = 0; d < 8; ++d) dot += q(b, h, i, d) * k(b, h, j, d);
            m = std::max(m, std::abs(dot) / std::sqrt(8.0));
          }
    return m;
  };
  const double factor = 1e4 / max_score();
  for (Index n = 0; n < truth.params().q_weight.size(); ++n) truth.params().q_weight.data()[n] *= factor;
  ASSERT_NEAR(max_score(), 1e4, 1.0);

  MultiHeadAttention<T> mha(cfg);
  const auto cast = [](const auto& from, auto& to) {
    for (Index n = 0; n < from.size(); ++n) to.data()[n] = static_cast<T>(from.data()[n]);
  };
  cast(truth.params().q_weight, mha.params().q_weight);
  cast(truth.params().k_weight, mha.params().k_weight);
  cast(truth.params().v_weight, mha.params().v_weight);
  cast(truth.params().out_weight, mha.params().out_weight);
  Tensor<T, 3> xt(x.shape());
  cast(x, xt);
  Tensor<T, 3> dout(x.shape());
  cast(random.normal_tensor<double, 3>(x.shape()), dout);
  Tensor<double, 3> dout_d(x.shape());
  cast(dout, dout_d);
  // The truth sees exactly the rounded inputs.
  Tensor<double, 3> x_rounded(x.shape());
  cast(xt, x_rounded);
  for (Tensor<double, 2>* w : {&truth.params().q_weight, &truth.params().k_weight, &truth.params().v_weight,
                               &truth.params().out_weight})
    for (Index n = 0; n < w->size(); ++n) w->data()[n] = static_cast<double>(static_cast<T>(w->data()[n]));

  const double tolerance = 64 * 1e4 * std::numeric_limits<T>::epsilon();
  AttentionOptions<double> causal_d;
  causal_d.causal = Causal::top_left;
  const auto expected = truth.forward(x_rounded, causal_d);
  const auto expected_g = truth.backward(dout_d, expected);
  for (Kernel kernel : kernels) {
    SCOPED_TRACE(kernel_name(kernel));
    AttentionOptions<T> causal;
    causal.causal = Causal::top_left;
    causal.kernel = kernel;
    const auto f = mha.forward(xt, causal);
    const auto g = mha.backward(dout, f);
    EXPECT_TRUE(all_finite(f.output));
    for (const Tensor<T, 3>* d : {&g.d_query, &g.d_key, &g.d_value}) EXPECT_TRUE(all_finite(*d));
    EXPECT_TRUE(all_finite(g.params.q_weight) && all_finite(g.params.k_weight) && all_finite(g.params.out_weight));
    EXPECT_TRUE(all_close(f.output, expected.output, tolerance));
    EXPECT_TRUE(all_close(g.d_query, expected_g.d_query, tolerance));
    EXPECT_TRUE(all_close(g.d_value, expected_g.d_value, tolerance));
    EXPECT_TRUE(all_close(g.params.v_weight, expected_g.params.v_weight, tolerance));
  }
  // step, one token at a time (the decode kernel), equals the causal forward.
  auto cache = mha.make_cache(B);
  for (Index t = 0; t < L; ++t) {
    const Tensor<T, 3> token(TensorView<const T, 3>(xt.data() + t * 16, {B, 1, 16}, {L * 16, 16, 1}));
    const Tensor<T, 3> y = mha.step(token, cache);
    ASSERT_TRUE(all_finite(y)) << "token " << t;
    for (Index b = 0; b < B; ++b)
      for (Index e = 0; e < 16; ++e)
        EXPECT_NEAR(static_cast<double>(y(b, 0, e)), expected.output(b, t, e), tolerance * std::max(1.0, max_abs(expected.output)))
            << "token " << t;
  }
}

// ---- 2. a bias of -inf everywhere but one key ----------------------------------------------------

// Row i's only finite score is at key j*: P_ij* = exp(0) / 1 = 1 exactly, so the output row is v_j* bit for bit
// and lse_i = s_ij*. In the backward dS_ij* = 1 * (dO_i . v_j* - dO_i . o_i) = 0 exactly (o_i = v_j*), so
// dq = dk = dbias = 0 and dv_j = the sum of dO_i over the rows that chose j.
TYPED_TEST(ExtremeInputsTest, MinusInfinityBiasEverywhereButOneKeySelectsThatValueRow) {
  using T = TypeParam;
  Random random(604);
  const Index B = 2, H = 2, Hkv = 1, Lq = 23, Lk = 75, D = 8, Dv = 6;
  const auto q = random.normal_tensor<T, 4>({B, H, Lq, D});
  const auto k = random.normal_tensor<T, 4>({B, Hkv, Lk, D});
  const auto v = random.normal_tensor<T, 4>({B, Hkv, Lk, Dv});
  const auto dout = random.normal_tensor<T, 4>({B, H, Lq, Dv});
  Tensor<T, 4> bias({B, H, Lq, Lk});
  bias.fill(-inf<T>);
  std::vector<Index> chosen;
  for (Index b = 0; b < B; ++b)
    for (Index h = 0; h < H; ++h)
      for (Index i = 0; i < Lq; ++i) {
        chosen.push_back(random.integer(0, Lk - 1));
        bias(b, h, i, chosen.back()) = T(0);
      }
  AttentionOptions<T> opts;
  opts.bias = bias;
  Tensor<T, 4> expected_dv(v.shape());
  for (Index b = 0, n = 0; b < B; ++b)
    for (Index h = 0; h < H; ++h)
      for (Index i = 0; i < Lq; ++i, ++n)
        for (Index d = 0; d < Dv; ++d) expected_dv(b, 0, chosen[static_cast<std::size_t>(n)], d) += dout(b, h, i, d);
  const auto brute = test::brute_force_attention<T>(q, k, v, opts);
  for (Kernel kernel : kernels) {
    SCOPED_TRACE(kernel_name(kernel));
    const auto fwd = sdpa_forward(q, k, v, on(kernel, opts));
    for (Index b = 0, n = 0; b < B; ++b)
      for (Index h = 0; h < H; ++h)
        for (Index i = 0; i < Lq; ++i, ++n)
          for (Index d = 0; d < Dv; ++d)
            ASSERT_EQ(fwd.out(b, h, i, d), v(b, 0, chosen[static_cast<std::size_t>(n)], d)) << b << h << i;
    EXPECT_TRUE(all_close(fwd.lse, brute.lse, default_tolerance<T>()));
    const auto g = sdpa_backward(q, k, v, fwd.out, fwd.lse, dout, on(kernel, opts));
    EXPECT_TRUE(all_zero(g.dq));
    EXPECT_TRUE(all_zero(g.dk));
    EXPECT_TRUE(all_zero(g.dbias));
    EXPECT_TRUE(all_close(g.dv, expected_dv, default_tolerance<T>()));
  }
  // The weights: exactly one 1 per row.
  AttentionOptions<T> with_weights = opts;
  with_weights.need_weights = true;
  const auto weights = sdpa_forward(q, k, v, with_weights).weights;
  for (Index b = 0, n = 0; b < B; ++b)
    for (Index h = 0; h < H; ++h)
      for (Index i = 0; i < Lq; ++i, ++n)
        for (Index j = 0; j < Lk; ++j) ASSERT_EQ(weights(b, h, i, j), j == chosen[static_cast<std::size_t>(n)] ? T(1) : T(0));
}

// The same through the module: a one-hot bias row gives the output of a one-hot `allowed` row, finite gradients.
TYPED_TEST(ExtremeInputsTest, MinusInfinityBiasEverywhereButOneKeyThroughTheModule) {
  using T = TypeParam;
  Random random(605);
  MultiHeadAttention<T> mha(ModuleConfig(12, 3), 3);
  const Index B = 2, L = 9;
  const auto x = random.normal_tensor<T, 3>({B, L, 12});
  const auto dout = random.normal_tensor<T, 3>({B, L, 12});
  Tensor<T, 4> bias({B, 3, L, L});
  Tensor<bool, 4> allowed({B, 3, L, L});
  bias.fill(-inf<T>);
  for (Index b = 0; b < B; ++b)
    for (Index h = 0; h < 3; ++h)
      for (Index i = 0; i < L; ++i) {
        const Index j = random.integer(0, L - 1);
        bias(b, h, i, j) = T(0);
        allowed(b, h, i, j) = true;
      }
  AttentionOptions<T> by_bias, by_mask;
  by_bias.bias = bias;
  by_mask.allowed = allowed;
  for (Kernel kernel : kernels) {
    SCOPED_TRACE(kernel_name(kernel));
    by_bias.kernel = by_mask.kernel = kernel;
    const auto f = mha.forward(x, by_bias);
    EXPECT_TRUE(all_close(f.output, mha.forward(x, by_mask).output, 0.0));
    const auto g = mha.backward(dout, f);
    for (const Tensor<T, 3>* d : {&g.d_query, &g.d_key, &g.d_value}) EXPECT_TRUE(all_finite(*d));
    for (const Tensor<T, 2>* w : {&g.params.q_weight, &g.params.k_weight, &g.params.v_weight, &g.params.out_weight})
      EXPECT_TRUE(all_finite(*w));
    EXPECT_TRUE(all_zero(g.params.q_weight)) << "dS = 0 on one-hot rows, so nothing reaches W_q";
  }
}

// ---- 3. empty shapes ------------------------------------------------------------------------------

// Lk = 0: every row is fully masked. out 0, lse -inf, weights (B, H, Lq, 0); dq 0, dk and dv empty.
TYPED_TEST(ExtremeInputsTest, NoKeysGiveZeroOutputMinusInfinityLseAndZeroGradients) {
  using T = TypeParam;
  Random random(606);
  const auto q = random.normal_tensor<T, 4>({2, 4, 19, 8});
  const Tensor<T, 4> k({2, 2, 0, 8}), v({2, 2, 0, 5}), bias({2, 1, 19, 0});
  const auto dout = random.normal_tensor<T, 4>({2, 4, 19, 5});
  AttentionOptions<T> opts;
  opts.bias = bias;
  opts.causal = Causal::bottom_right;
  for (Kernel kernel : kernels) {
    SCOPED_TRACE(kernel_name(kernel));
    const auto fwd = sdpa_forward(q, k, v, on(kernel, opts));
    EXPECT_EQ(fwd.out.shape(), (std::array<Index, 4>{2, 4, 19, 5}));
    EXPECT_TRUE(all_zero(fwd.out));
    for (Index n = 0; n < fwd.lse.size(); ++n) ASSERT_EQ(fwd.lse.data()[n], -inf<T>);
    const auto g = sdpa_backward(q, k, v, fwd.out, fwd.lse, dout, on(kernel, opts));
    EXPECT_EQ(g.dq.shape(), q.shape());
    EXPECT_TRUE(all_zero(g.dq));
    EXPECT_EQ(g.dk.size(), 0);
    EXPECT_EQ(g.dv.size(), 0);
    EXPECT_EQ(g.dbias.shape(), bias.shape());
  }
  AttentionOptions<T> with_weights = opts;
  with_weights.need_weights = true;
  EXPECT_EQ(sdpa_forward(q, k, v, with_weights).weights.shape(), (std::array<Index, 4>{2, 4, 19, 0}));
  EXPECT_EQ(attention_weights(q, k, opts).size(), 0);
  EXPECT_TRUE(all_zero(scaled_dot_product_attention(q, k, v, opts)));

  // The module over an empty key sequence: attention 0, so the output is the output bias on every row.
  MultiHeadAttention<T> mha(ModuleConfig(8, 2));
  for (Index e = 0; e < 8; ++e) mha.params().out_bias(e) = static_cast<T>(e + 1);
  const auto query = random.normal_tensor<T, 3>({2, 5, 8});
  const Tensor<T, 3> empty({2, 0, 8});
  const auto dy = random.normal_tensor<T, 3>({2, 5, 8});
  for (Kernel kernel : kernels) {
    SCOPED_TRACE(kernel_name(kernel));
    const auto f = mha.forward(query, empty, empty, on<T>(kernel));
    for (Index b = 0; b < 2; ++b)
      for (Index l = 0; l < 5; ++l)
        for (Index e = 0; e < 8; ++e) ASSERT_EQ(f.output(b, l, e), static_cast<T>(e + 1));
    const auto g = mha.backward(dy, f);
    EXPECT_TRUE(all_zero(g.d_query));
    EXPECT_EQ(g.d_key.shape(), empty.shape());
    EXPECT_EQ(g.d_value.shape(), empty.shape());
    EXPECT_TRUE(all_zero(g.params.q_weight) && all_zero(g.params.k_weight) && all_zero(g.params.v_weight));
    EXPECT_TRUE(all_zero(g.params.out_weight)) << "the attention output is 0";
    for (Index e = 0; e < 8; ++e) {
      double sum = 0;
      for (Index b = 0; b < 2; ++b)
        for (Index l = 0; l < 5; ++l) sum += static_cast<double>(dy(b, l, e));
      EXPECT_NEAR(static_cast<double>(g.params.out_bias(e)), sum, 1e-5);
    }
  }
}

// B = 0, Lq = 0 and Dv = 0: empty results of the right shapes, nothing computed, nothing thrown; gradients too.
TYPED_TEST(ExtremeInputsTest, EmptyBatchEmptyQueriesAndEmptyValuesGiveEmptyResults) {
  using T = TypeParam;
  Random random(607);
  struct Case {
    std::array<Index, 4> q, k, v;
  };
  const std::vector<Case> cases = {
      {{0, 2, 5, 4}, {0, 1, 7, 4}, {0, 1, 7, 3}},  // B = 0
      {{2, 2, 0, 4}, {2, 1, 7, 4}, {2, 1, 7, 3}},  // Lq = 0
      {{2, 2, 0, 4}, {2, 1, 0, 4}, {2, 1, 0, 3}},  // Lq = Lk = 0
      {{2, 2, 5, 4}, {2, 1, 7, 4}, {2, 1, 7, 0}},  // Dv = 0: lse still computed
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(detail::shape_string<4>(c.q) + " " + detail::shape_string<4>(c.k) + " " + detail::shape_string<4>(c.v));
    const auto q = random.normal_tensor<T, 4>(c.q);
    const auto k = random.normal_tensor<T, 4>(c.k);
    const auto v = random.normal_tensor<T, 4>(c.v);
    const Tensor<T, 4> dout({c.q[0], c.q[1], c.q[2], c.v[3]});
    AttentionOptions<T> causal;
    causal.causal = Causal::bottom_right;
    const auto brute = test::brute_force_attention<T>(q, k, v, causal);
    for (Kernel kernel : kernels) {
      SCOPED_TRACE(kernel_name(kernel));
      const auto fwd = sdpa_forward(q, k, v, on(kernel, causal));
      EXPECT_EQ(fwd.out.shape(), dout.shape());
      EXPECT_EQ(fwd.lse.size(), c.q[0] * c.q[1] * c.q[2]);
      EXPECT_TRUE(all_close(fwd.lse, brute.lse, default_tolerance<T>()));
      const auto g = sdpa_backward(q, k, v, fwd.out, fwd.lse, dout, on(kernel, causal));
      EXPECT_EQ(g.dq.shape(), q.shape());
      EXPECT_EQ(g.dk.shape(), k.shape());
      EXPECT_EQ(g.dv.shape(), v.shape());
      EXPECT_TRUE(all_zero(g.dq) && all_zero(g.dk) && all_zero(g.dv)) << "dout is empty or 0";
    }
    EXPECT_EQ(scaled_dot_product_attention(q, k, v).shape(), dout.shape());
    EXPECT_EQ(attention_weights(q, k).shape(), (std::array<Index, 4>{c.q[0], c.q[1], c.q[2], c.k[2]}));
  }
  // D = 0 is not attention (no scores): rejected, naming q.
  expect_error<ShapeError>([] { sdpa_forward(Tensor<T, 4>({1, 1, 2, 0}), Tensor<T, 4>({1, 1, 2, 0}), Tensor<T, 4>({1, 1, 2, 3})); },
                           {"q", "head dim"});

  // The module with B = 0 and with Lq = Lk = 0; step with B = 0 and with no new token.
  MultiHeadAttention<T> mha(ModuleConfig(8, 2));
  for (const std::array<Index, 3>& shape : {std::array<Index, 3>{0, 4, 8}, std::array<Index, 3>{3, 0, 8}}) {
    SCOPED_TRACE(detail::shape_string<3>(shape));
    const Tensor<T, 3> x(shape);
    for (Kernel kernel : kernels) {
      const auto f = mha.forward(x, on<T>(kernel));
      EXPECT_EQ(f.output.shape(), shape);
      const auto g = mha.backward(Tensor<T, 3>(shape), f);
      EXPECT_EQ(g.d_query.shape(), shape);
      EXPECT_TRUE(all_zero(g.params.q_weight) && all_zero(g.params.out_weight) && all_zero(g.params.out_bias));
    }
  }
  auto no_sequences = mha.make_cache(0);
  EXPECT_EQ(mha.step(Tensor<T, 3>({0, 3, 8}), no_sequences).shape(), (std::array<Index, 3>{0, 3, 8}));
  EXPECT_EQ(no_sequences.length(), 0);
  auto cache = mha.make_cache(2);
  const auto prompt = random.normal_tensor<T, 3>({2, 4, 8});
  mha.step(prompt, cache);
  const std::vector<Index> lengths = cache.lengths();
  const Tensor<T, 4> keys(cache.keys());
  EXPECT_EQ(mha.step(Tensor<T, 3>({2, 0, 8}), cache).shape(), (std::array<Index, 3>{2, 0, 8}));
  EXPECT_EQ(cache.lengths(), lengths);
  EXPECT_TRUE(all_close(cache.keys(), keys, 0.0));
}

// ---- 4. head dim 1 --------------------------------------------------------------------------------

TYPED_TEST(ExtremeInputsTest, HeadDimOneMatchesTheSpecification) {
  using T = TypeParam;
  Random random(608);
  const auto q = random.normal_tensor<T, 4>({2, 4, 35, 1}, 3.0);
  const auto k = random.normal_tensor<T, 4>({2, 2, 70, 1}, 3.0);
  const auto v = random.normal_tensor<T, 4>({2, 2, 70, 1});
  const auto dout = random.normal_tensor<T, 4>({2, 4, 35, 1});
  const auto naive = naive_attention<T>(q, k, v, dout, 1.0, static_cast<const Tensor<T, 4>*>(nullptr), true);
  const auto truth = naive_attention<long double>(q, k, v, dout, 1.0);
  for (Kernel kernel : kernels) {
    SCOPED_TRACE(kernel_name(kernel));
    const auto fwd = sdpa_forward(q, k, v, on<T>(kernel));  // default scale 1 / sqrt(1) = 1
    const auto g = sdpa_backward(q, k, v, fwd.out, fwd.lse, dout, on<T>(kernel));
    EXPECT_TRUE(within_flash_rule<T>("out", fwd.out, naive.out, truth.out));
    EXPECT_TRUE(within_flash_rule<T>("lse", fwd.lse, naive.lse, truth.lse));
    EXPECT_TRUE(within_flash_rule<T>("dq", g.dq, naive.dq, truth.dq));
    EXPECT_TRUE(within_flash_rule<T>("dk", g.dk, naive.dk, truth.dk));
    EXPECT_TRUE(within_flash_rule<T>("dv", g.dv, naive.dv, truth.dv));
    AttentionOptions<T> masked;
    masked.causal = Causal::bottom_right;
    masked.window_left = 3;
    EXPECT_TRUE(all_close(sdpa_forward(q, k, v, on(kernel, masked)).out, test::brute_force_attention<T>(q, k, v, masked).out,
                          default_tolerance<T>()));
  }
  // The module with one dimension per head (E = H = 4): forward equals step token by token, and in double the
  // input gradient equals finite differences.
  MultiHeadAttention<T> mha(ModuleConfig(4, 4).kv_heads(2), 11);
  ASSERT_EQ(mha.head_dim(), 1);
  const auto x = random.normal_tensor<T, 3>({2, 6, 4});
  AttentionOptions<T> causal;
  causal.causal = Causal::top_left;
  const auto f = mha.forward(x, causal);
  auto cache = mha.make_cache(2);
  EXPECT_TRUE(all_close(mha.step(x, cache), f.output, default_tolerance<T>()));
  if constexpr (std::is_same_v<T, double>) {
    Tensor<double, 3> xv = x;
    const auto dy = random.normal_tensor<double, 3>(x.shape());
    const auto g = mha.backward(dy, mha.forward(xv, x, x, causal));
    const auto numeric = test::numerical_gradient(xv, [&] { return test::weighted_sum(mha.forward(xv, x, x, causal).output, dy); });
    EXPECT_TRUE(all_close(g.d_query, numeric, 1e-7));
  }
}

// ---- 5. NaN and inf inside the inputs ---------------------------------------------------------------

// The rules (docs/numerics.md, "NaN and inf"): a non-finite input reaches exactly the outputs whose formula
// reads it at an allowed position, and nothing else — every other element is bit for bit what it is without it.
// Causal top-left with Lq = Lk makes "who attends to key j" the rows i >= j.

template <typename T>
struct Problem {
  Tensor<T, 4> q, k, v, dout;
  AttentionOptions<T> opts;
};

template <typename T>
Problem<T> causal_problem(Random& random, Index L = 40) {
  Problem<T> p{random.normal_tensor<T, 4>({2, 2, L, 8}), random.normal_tensor<T, 4>({2, 1, L, 8}),
               random.normal_tensor<T, 4>({2, 1, L, 6}), random.normal_tensor<T, 4>({2, 2, L, 6}), {}};
  p.opts.causal = Causal::top_left;
  return p;
}

// A problem's forward, and its backward from that forward's out and lse, on one kernel: the tests below compare the
// run of a problem with that of a copy holding a non-finite number.
template <typename T>
struct Run {
  AttentionForward<T> f;
  AttentionGradients<T> g;
};

template <typename T>
Run<T> run(const Problem<T>& p, Kernel kernel) {
  const auto opts = on(kernel, p.opts);
  auto f = sdpa_forward(p.q, p.k, p.v, opts);
  auto g = sdpa_backward(p.q, p.k, p.v, f.out, f.lse, p.dout, opts);
  return {std::move(f), std::move(g)};
}

// NaN in q row i (batch 1, head 0): only output row i of that head is NaN (and its lse); every other row is
// unchanged. Backward: dq row i and the dk, dv rows of the keys row i attends (j <= i) are NaN; every other
// gradient row is unchanged.
TYPED_TEST(ExtremeInputsTest, NanInAQueryRowReachesOnlyThatRow) {
  using T = TypeParam;
  Random random(609);
  const Problem<T> clean = causal_problem<T>(random);
  const Index L = clean.q.dim(2), i = 21;
  Problem<T> bad = clean;
  bad.q(1, 0, i, 3) = nan<T>;
  for (Kernel kernel : kernels) {
    SCOPED_TRACE(kernel_name(kernel));
    const auto [f0, g0] = run(clean, kernel);
    const auto [f1, g1] = run(bad, kernel);
    const auto row_i = [&](Index b, Index h, Index r) { return b == 1 && h == 0 && r == i; };
    expect_nan_rows(f1.out, f0.out, row_i);
    for (Index b = 0; b < 2; ++b)
      for (Index h = 0; h < 2; ++h)
        for (Index r = 0; r < L; ++r) EXPECT_EQ(std::isnan(f1.lse(b, h, r)), row_i(b, h, r));
    expect_nan_rows(g1.dq, g0.dq, row_i);
    const auto keys_row_i_attends = [&](Index b, Index, Index r) { return b == 1 && r <= i; };
    expect_nan_rows(g1.dk, g0.dk, keys_row_i_attends);
    expect_nan_rows(g1.dv, g0.dv, keys_row_i_attends);
  }
}

// NaN in an allowed key j: every row that attends j (rows i >= j, both heads of the group) is NaN, rows i < j
// are unchanged; in the backward dq rows i >= j are NaN and rows i < j unchanged.
TYPED_TEST(ExtremeInputsTest, NanInAKeyReachesEveryRowThatAttendsIt) {
  using T = TypeParam;
  Random random(610);
  const Problem<T> clean = causal_problem<T>(random);
  const Index L = clean.q.dim(2), j = 17;
  Problem<T> bad = clean;
  bad.k(0, 0, j, 5) = nan<T>;
  for (Kernel kernel : kernels) {
    SCOPED_TRACE(kernel_name(kernel));
    const auto [f0, g0] = run(clean, kernel);
    const auto [f1, g1] = run(bad, kernel);
    const auto rows_attending_j = [&](Index b, Index, Index r) { return b == 0 && r >= j; };
    expect_nan_rows(f1.out, f0.out, rows_attending_j);
    expect_nan_rows(g1.dq, g0.dq, rows_attending_j);
    // Batch 1 never sees the NaN: its gradients are unchanged.
    for (Index r = 0; r < L; ++r) EXPECT_TRUE(row_equal(g1.dk, g0.dk, 1, 0, r) && row_equal(g1.dv, g0.dv, 1, 0, r));
  }
}

// NaN or inf in one element v_j[d] of an allowed value row: column d of the rows that attend j is NaN (inf of
// the same sign for an inf: weights are positive); every other column and row, and every lse, is unchanged.
// dv is unchanged (dv_j = sum_i P_ij dO_i does not read v).
TYPED_TEST(ExtremeInputsTest, NonFiniteValueElementReachesOnlyItsColumnOfTheRowsThatAttendIt) {
  using T = TypeParam;
  Random random(611);
  const Problem<T> clean = causal_problem<T>(random);
  const Index L = clean.q.dim(2), j = 9, column = 4;
  for (const T planted : {nan<T>, inf<T>, -inf<T>}) {
    SCOPED_TRACE(planted);
    Problem<T> bad = clean;
    bad.v(1, 0, j, column) = planted;
    for (Kernel kernel : kernels) {
      SCOPED_TRACE(kernel_name(kernel));
      const auto [f0, g0] = run(clean, kernel);
      const auto [f1, g1] = run(bad, kernel);
      EXPECT_TRUE(all_close(f1.lse, f0.lse, 0.0));
      for (Index b = 0; b < 2; ++b)
        for (Index h = 0; h < 2; ++h)
          for (Index r = 0; r < L; ++r)
            for (Index d = 0; d < 6; ++d) {
              const T got = f1.out(b, h, r, d);
              if (b == 1 && r >= j && d == column) {
                if (std::isnan(planted))
                  EXPECT_TRUE(std::isnan(got)) << h << r;
                else
                  EXPECT_EQ(got, planted) << h << r;
              } else {
                EXPECT_EQ(got, f0.out(b, h, r, d)) << b << h << r << d;
              }
            }
      EXPECT_TRUE(all_close(g1.dv, g0.dv, 0.0));
      for (Index r = 0; r < j; ++r)
        for (Index h = 0; h < 2; ++h) EXPECT_TRUE(row_equal(g1.dq, g0.dq, 1, h, r)) << "rows before j do not attend it";
      for (Index r = j; r < L; ++r) EXPECT_FALSE(row_finite(g1.dq, 1, 0, r)) << r;
    }
  }
}

// A bias entry at an allowed (i, j): NaN or +inf makes row i NaN (out and lse), as PyTorch's softmax does
// (+inf - +inf is NaN; the limit is not taken); -inf masks the pair. At a masked (i, j) nothing happens.
TYPED_TEST(ExtremeInputsTest, NanOrInfinityInABiasEntry) {
  using T = TypeParam;
  Random random(612);
  const Problem<T> p = causal_problem<T>(random);
  const Index L = p.q.dim(2), i = 30, j = 12;
  Tensor<T, 4> zero_bias({1, 1, L, L});
  for (Kernel kernel : kernels) {
    SCOPED_TRACE(kernel_name(kernel));
    AttentionOptions<T> opts = on(kernel, p.opts);
    opts.bias = zero_bias;
    const auto f0 = sdpa_forward(p.q, p.k, p.v, opts);
    for (const T planted : {nan<T>, inf<T>}) {
      SCOPED_TRACE(planted);
      Tensor<T, 4> bias = zero_bias;
      bias(0, 0, i, j) = planted;          // allowed: j <= i
      bias(0, 0, 3, 20) = planted;         // masked by causality
      AttentionOptions<T> with = opts;
      with.bias = bias;
      const auto f1 = sdpa_forward(p.q, p.k, p.v, with);
      for (Index b = 0; b < 2; ++b)
        for (Index h = 0; h < 2; ++h)
          for (Index r = 0; r < L; ++r) {
            EXPECT_EQ(row_all_nan(f1.out, b, h, r), r == i) << b << h << r;
            EXPECT_EQ(std::isnan(f1.lse(b, h, r)), r == i) << b << h << r;
            if (r != i) {
              EXPECT_TRUE(row_equal(f1.out, f0.out, b, h, r)) << b << h << r;
            }
          }
      const auto g = sdpa_backward(p.q, p.k, p.v, f1.out, f1.lse, p.dout, with);
      EXPECT_TRUE(row_all_nan(g.dq, 0, 0, i));
      EXPECT_TRUE(row_finite(g.dq, 0, 0, i - 1));
    }
    // -inf at (i, j) is allowed = false at (i, j).
    Tensor<T, 4> minus = zero_bias;
    minus(0, 0, i, j) = -inf<T>;
    Tensor<bool, 4> allowed({1, 1, L, L});
    allowed.fill(true);
    allowed(0, 0, i, j) = false;
    AttentionOptions<T> by_bias = opts, by_mask = opts;
    by_bias.bias = minus;
    by_mask.allowed = allowed;
    EXPECT_TRUE(all_close(sdpa_forward(p.q, p.k, p.v, by_bias).out, sdpa_forward(p.q, p.k, p.v, by_mask).out, 0.0));
  }
}

// An infinite entry of q makes scores +-inf (or NaN when it meets a 0): a -inf score is a masked pair (the
// documented rule for any -inf score), a +inf or NaN score makes the row NaN. So q_i = (+inf, 0, ..., 0) with
// every k_j[0] < 0 is a row without an allowed key (out 0, lse -inf, no gradient), and one k_j[0] > 0 makes it NaN.
TYPED_TEST(ExtremeInputsTest, InfiniteQueryEntryGivesInfiniteScoresWithTheirMaskingRule) {
  using T = TypeParam;
  Random random(613);
  Problem<T> p = causal_problem<T>(random);
  p.opts.causal = Causal::none;
  const Index L = p.q.dim(2), i = 7;
  for (Index j = 0; j < L; ++j) p.k(0, 0, j, 0) = -std::abs(p.k(0, 0, j, 0)) - T(0.1);
  for (Index d = 0; d < 8; ++d) p.q(0, 1, i, d) = d == 0 ? inf<T> : T(0);
  for (Kernel kernel : kernels) {
    SCOPED_TRACE(kernel_name(kernel));
    const auto opts = on(kernel, p.opts);
    const auto f = sdpa_forward(p.q, p.k, p.v, opts);
    for (Index d = 0; d < 6; ++d) EXPECT_EQ(f.out(0, 1, i, d), T(0));
    EXPECT_EQ(f.lse(0, 1, i), -inf<T>);
    EXPECT_TRUE(all_finite(f.out));
    const auto g = sdpa_backward(p.q, p.k, p.v, f.out, f.lse, p.dout, opts);
    EXPECT_TRUE(all_zero(Tensor<T, 1>(TensorView<const T, 1>(&g.dq(0, 1, i, 0), {8}))));
    EXPECT_TRUE(all_finite(g.dk) && all_finite(g.dv));

    Problem<T> one_positive = p;
    one_positive.k(0, 0, 33, 0) = T(0.5);
    const auto f1 = sdpa_forward(one_positive.q, one_positive.k, one_positive.v, opts);
    EXPECT_TRUE(row_all_nan(f1.out, 0, 1, i));
    EXPECT_TRUE(row_finite(f1.out, 0, 0, i)) << "head 0's row i has a finite query";
  }
}

// NaN in the upstream gradient dO_i: dq_i and the dk, dv rows of the keys row i attends are NaN, nothing else.
TYPED_TEST(ExtremeInputsTest, NanInTheUpstreamGradientReachesOnlyThatRowsGradients) {
  using T = TypeParam;
  Random random(614);
  const Problem<T> clean = causal_problem<T>(random);
  const Index L = clean.q.dim(2), i = 11;
  Problem<T> bad = clean;
  bad.dout(0, 1, i, 2) = nan<T>;
  for (Kernel kernel : kernels) {
    SCOPED_TRACE(kernel_name(kernel));
    const AttentionGradients<T> g0 = run(clean, kernel).g, g1 = run(bad, kernel).g;  // the forward reads no dout
    for (Index r = 0; r < L; ++r) {
      EXPECT_EQ(row_all_nan(g1.dq, 0, 1, r), r == i) << r;
      if (r != i) {
        EXPECT_TRUE(row_equal(g1.dq, g0.dq, 0, 1, r) && row_equal(g1.dq, g0.dq, 0, 0, r)) << r;
      }
      EXPECT_EQ(row_all_nan(g1.dk, 0, 0, r), r <= i) << r;
      if (r > i) {
        EXPECT_TRUE(row_equal(g1.dk, g0.dk, 0, 0, r) && row_equal(g1.dv, g0.dv, 0, 0, r)) << r;
      }
    }
    EXPECT_FALSE(row_finite(g1.dv, 0, 0, i));
    for (Index h = 0; h < 2; ++h)
      for (Index r = 0; r < L; ++r) EXPECT_TRUE(row_equal(g1.dq, g0.dq, 1, h, r)) << "batch 1 is another problem";
  }
}

// Non-finite numbers where the masks say nobody looks never reach anything: NaN in the query of a row without any
// allowed key, NaN and inf in padded keys and values, NaN and +inf bias at masked pairs. Forward and backward are
// bit for bit those of the same call with finite numbers there.
TYPED_TEST(ExtremeInputsTest, NonFiniteNumbersAtMaskedPositionsNeverReachAnOutput) {
  using T = TypeParam;
  Random random(615);
  const Index L = 40;
  Problem<T> clean = causal_problem<T>(random, L);
  clean.opts.causal = Causal::bottom_right;
  clean.opts.key_lengths = {L - 3, 0};  // batch 1: no key at all
  Tensor<T, 4> bias = random.normal_tensor<T, 4>({2, 1, L, L});
  Tensor<bool, 4> allowed({2, 1, L, L});
  allowed.fill(true);
  for (Index j = 0; j < L; ++j) allowed(0, 0, 5, j) = false;  // batch 0, row 5: no allowed key
  clean.opts.bias = bias;
  clean.opts.allowed = allowed;
  Problem<T> bad = clean;
  Tensor<T, 4> bad_bias = bias;
  bad.opts.bias = bad_bias;
  for (Index d = 0; d < 8; ++d) {
    bad.q(0, 0, 5, d) = nan<T>;          // a fully masked row
    bad.q(1, 1, 20, d) = inf<T>;         // batch 1 sees no key
    bad.k(0, 0, L - 1, d) = nan<T>;      // padding
    bad.k(0, 0, L - 2, d) = -inf<T>;
  }
  for (Index d = 0; d < 6; ++d) {
    bad.v(0, 0, L - 1, d) = inf<T>;
    bad.v(0, 0, L - 3, d) = nan<T>;
  }
  bad_bias(0, 0, 9, 30) = nan<T>;        // above the causal diagonal
  bad_bias(0, 0, 9, 31) = inf<T>;
  bad_bias(0, 0, 5, 2) = inf<T>;         // the fully masked row
  bad_bias(0, 0, 20, L - 1) = nan<T>;    // padding
  for (Kernel kernel : kernels) {
    SCOPED_TRACE(kernel_name(kernel));
    const auto [f0, g0] = run(clean, kernel);
    const auto [f1, g1] = run(bad, kernel);
    EXPECT_TRUE(all_finite(f1.out));
    EXPECT_TRUE(all_close(f1.out, f0.out, 0.0));
    EXPECT_TRUE(all_close(f1.lse, f0.lse, 0.0));
    EXPECT_EQ(f1.lse(0, 0, 5), -inf<T>);
    for (const auto& pair : {std::make_pair(&g1.dq, &g0.dq), std::make_pair(&g1.dk, &g0.dk), std::make_pair(&g1.dv, &g0.dv),
                             std::make_pair(&g1.dbias, &g0.dbias)}) {
      EXPECT_TRUE(all_finite(*pair.first));
      EXPECT_TRUE(all_close(*pair.first, *pair.second, 0.0));
    }
  }
}

// ---- 6. NaN through the module and the decoder -------------------------------------------------------

// Causal self-attention: a NaN in token t makes output rows t.. NaN (they attend t), rows before t unchanged.
// A NaN in a padded key token (key_lengths) changes nothing, forward or backward.
TYPED_TEST(ExtremeInputsTest, NanTokensThroughTheModule) {
  using T = TypeParam;
  Random random(616);
  MultiHeadAttention<T> mha(ModuleConfig(16, 4).kv_heads(2).rope(4), 5);
  const Index L = 19, t = 8;
  const auto x = random.normal_tensor<T, 3>({2, L, 16});
  const auto dy = random.normal_tensor<T, 3>({2, L, 16});
  Tensor<T, 3> bad = x;
  bad(1, t, 3) = nan<T>;
  for (Kernel kernel : kernels) {
    SCOPED_TRACE(kernel_name(kernel));
    AttentionOptions<T> causal;
    causal.causal = Causal::top_left;
    causal.kernel = kernel;
    const auto f0 = mha.forward(x, causal), f1 = mha.forward(bad, causal);
    for (Index b = 0; b < 2; ++b)
      for (Index l = 0; l < L; ++l)
        for (Index e = 0; e < 16; ++e) {
          if (b == 1 && l >= t)
            ASSERT_TRUE(std::isnan(f1.output(b, l, e))) << l << " " << e;
          else
            ASSERT_EQ(f1.output(b, l, e), f0.output(b, l, e)) << b << " " << l << " " << e;
        }

    // Key padding: batch 0 uses its first 12 keys; a NaN in its key and value tokens 12.. reaches nothing.
    AttentionOptions<T> padded;
    padded.key_lengths = {12, L};
    padded.kernel = kernel;
    const auto query = random.normal_tensor<T, 3>({2, 7, 16});
    Tensor<T, 3> memory = random.normal_tensor<T, 3>({2, L, 16}), bad_memory = memory;
    for (Index l = 12; l < L; ++l)
      for (Index e = 0; e < 16; ++e) bad_memory(0, l, e) = (l % 2 != 0) ? nan<T> : inf<T>;
    const auto dq = random.normal_tensor<T, 3>({2, 7, 16});
    const auto p0 = mha.forward(query, memory, memory, padded), p1 = mha.forward(query, bad_memory, bad_memory, padded);
    EXPECT_TRUE(all_close(p1.output, p0.output, 0.0));
    const auto g0 = mha.backward(dq, p0), g1 = mha.backward(dq, p1);
    EXPECT_TRUE(all_close(g1.d_query, g0.d_query, 0.0));
    // The padded rows' input gradients are 0 (their projections are never read), the others unchanged.
    EXPECT_TRUE(all_finite(g1.d_key) && all_finite(g1.d_value));
    EXPECT_TRUE(all_close(g1.d_key, g0.d_key, 0.0));
    EXPECT_TRUE(all_close(g1.params.q_weight, g0.params.q_weight, 0.0));
    EXPECT_TRUE(all_close(g1.params.out_weight, g0.params.out_weight, 0.0));
    // dW_k = dK^T x sums over every key row, padded ones included: dK_l = 0 there, and 0 * NaN would be NaN.
    // linear_backward leaves such rows out (regression: these were NaN).
    for (const auto& pair : {std::make_pair(&g1.params.k_weight, &g0.params.k_weight),
                             std::make_pair(&g1.params.v_weight, &g0.params.v_weight)}) {
      EXPECT_TRUE(all_finite(*pair.first));
      EXPECT_TRUE(all_close(*pair.first, *pair.second, default_tolerance<T>()));  // summed in another order
    }
    EXPECT_TRUE(all_close(g1.d_value, g0.d_value, 0.0));
    EXPECT_TRUE(all_close(g1.params.k_bias, g0.params.k_bias, 0.0));
  }
}

// Decoding under a sliding window: a NaN token poisons the steps that attend it and is gone once evicted.
TYPED_TEST(ExtremeInputsTest, NanTokenLeavesTheDecodeWindowWhenEvicted) {
  using T = TypeParam;
  Random random(617);
  MultiHeadAttention<T> mha(ModuleConfig(8, 2), 9);
  const Index window = 4, t = 5, total = 14;
  auto cache = mha.make_cache(1, CachePolicy::sliding_window(window));
  for (Index s = 0; s < total; ++s) {
    Tensor<T, 3> token = random.normal_tensor<T, 3>({1, 1, 8});
    if (s == t) token(0, 0, 0) = nan<T>;
    const auto y = mha.step(token, cache);
    // Token s attends to tokens s - window + 1 .. s.
    const bool sees_nan = s >= t && s < t + window;
    EXPECT_EQ(!all_finite(y), sees_nan) << "step " << s;
  }
}

// A prefill of a few rows runs the decode kernel with a causal mask: a NaN in token t must make rows t.. NaN,
// as the forward does, and leave rows before t unchanged. (The reference kernel once took a NaN score followed
// by masked -inf scores in the same row for a fully masked row: zeros, silently dropping its real keys.)
template <typename T>
void check_nan_prefill(const AttentionOptions<T>& opts) {
  Random random(620);
  MultiHeadAttention<T> mha(ModuleConfig(8, 2), 10);
  const Index L = 9, t = 3;
  const auto x = random.normal_tensor<T, 3>({1, L, 8});
  Tensor<T, 3> bad = x;
  bad(0, t, 1) = nan<T>;
  auto clean_cache = mha.make_cache(1), bad_cache = mha.make_cache(1);
  const auto y0 = mha.step(x, clean_cache, opts), y1 = mha.step(bad, bad_cache, opts);
  for (Index l = 0; l < L; ++l)
    for (Index e = 0; e < 8; ++e) {
      if (l >= t)
        EXPECT_TRUE(std::isnan(y1(0, l, e))) << "row " << l;
      else
        EXPECT_EQ(y1(0, l, e), y0(0, l, e)) << "row " << l;
    }
}

// Without masks the decode kernel's grouped path runs.
TYPED_TEST(ExtremeInputsTest, NanInAPrefillReachesTheRowsThatAttendIt) { check_nan_prefill<TypeParam>({}); }

// An `allowed` mask (all true) sends the prefill down the decode kernel's general path. Its row maximum once
// read `if (!(s(r, c) <= m)) m = s(r, c);`, which turned row t (the row whose last allowed key is the NaN) into
// a fully masked row of zeros; it now keeps a NaN once seen, as the reference kernel does. Regression test.
TYPED_TEST(ExtremeInputsTest, NanInAMaskedPrefillReachesTheRowsThatAttendIt) {
  Tensor<bool, 4> all_true({1, 1, 9, 9});
  all_true.fill(true);
  AttentionOptions<TypeParam> masked;
  masked.allowed = all_true;
  check_nan_prefill<TypeParam>(masked);
}

// ---- 7. aliasing ---------------------------------------------------------------------------------------

TEST(ExtremeInputsAliasing, OverlapsComparesAddressRanges) {
  Tensor<float, 2> a({4, 6}), b({4, 6});
  const TensorView<float, 2> all = a.view();
  const TensorView<float, 2> first_rows(a.data(), {2, 6});
  const TensorView<float, 2> last_rows(a.data() + 12, {2, 6});
  const TensorView<const float, 2> column(a.data() + 2, {4, 1}, {6, 1});
  EXPECT_TRUE(detail::overlaps(all, first_rows));
  EXPECT_FALSE(detail::overlaps(first_rows, last_rows));
  EXPECT_TRUE(detail::overlaps(column, last_rows));
  EXPECT_FALSE(detail::overlaps(all, b.view()));
  EXPECT_FALSE(detail::overlaps(TensorView<float, 2>(a.data(), {0, 6}), all)) << "an empty view overlaps nothing";
  EXPECT_TRUE(detail::overlaps(TensorView<const float, 1>(a.data() + 23, {1}), all));
  EXPECT_FALSE(detail::overlaps(TensorView<const float, 1>(a.data() + 24, {1}), all));
}

TEST(ExtremeInputsAliasing, CopyFromAnOverlappingViewIsRejected) {
  Tensor<float, 2> square({3, 3});
  for (Index n = 0; n < 9; ++n) square.data()[n] = static_cast<float>(n);
  // Rows 0 and 1 of a window shifted by one element: elements 1..6.
  const TensorView<const float, 2> shifted(square.data() + 1, {2, 3}, {3, 1});
  Tensor<float, 2> other({2, 3});
  other.copy_from(shifted);  // into another tensor: fine
  EXPECT_EQ(other(1, 2), 6.0f);
  // Into the tensor it views: element by element, each write would change a later read.
  Tensor<float, 2> t({2, 3});
  expect_error<std::invalid_argument>([&] { t.copy_from(TensorView<const float, 2>(t.data() + 1, {2, 3}, {2, 1})); },
                                      {"copy_from", "source", "destination"});
  // The tensor itself, in its own layout, is a no-op rather than an error.
  square.copy_from(square.view());
  EXPECT_EQ(square(2, 1), 7.0f);
}

TEST(ExtremeInputsAliasing, RotaryEmbeddingRejectsAViewWhoseRowsOverlap) {
  RotaryEmbedding<float> rope(4);
  Tensor<float, 4> x({1, 1, 3, 4});
  // Stride 0 along the rows: three rows on the same memory would be rotated three times.
  const TensorView<float, 4> repeated(x.data(), {1, 1, 3, 4}, {12, 12, 0, 1});
  expect_error<std::invalid_argument>([&] { rope.apply(repeated, 0); }, {"RotaryEmbedding::apply", "x", "overlap"});
  expect_error<std::invalid_argument>([&] { rope.apply_inverse(repeated, 0); }, {"RotaryEmbedding::apply_inverse", "x"});
  // Stride 2 with rows of 4: row l's last two elements are row l + 1's first two.
  const TensorView<float, 4> interleaved(x.data(), {1, 1, 2, 4}, {12, 12, 2, 1});
  expect_error<std::invalid_argument>([&] { rope.apply(interleaved, 0); }, {"x"});
  rope.apply(x, 0);  // the tensor itself is fine
}

// Inputs may alias each other (they are only read): q = k = v one tensor, and dout = out. Bit for bit the
// results of distinct copies.
TYPED_TEST(ExtremeInputsTest, InputsMayAliasEachOther) {
  using T = TypeParam;
  Random random(618);
  const auto x = random.normal_tensor<T, 4>({2, 2, 33, 8});
  const Tensor<T, 4> k_copy = x, v_copy = x;
  for (Kernel kernel : kernels) {
    SCOPED_TRACE(kernel_name(kernel));
    AttentionOptions<T> opts = on<T>(kernel);
    opts.causal = Causal::top_left;
    const auto aliased = sdpa_forward(x, x, x, opts), copied = sdpa_forward(x, k_copy, v_copy, opts);
    EXPECT_TRUE(all_close(aliased.out, copied.out, 0.0));
    const Tensor<T, 4> out_copy = aliased.out;
    const auto g_aliased = sdpa_backward(x, x, x, aliased.out, aliased.lse, aliased.out, opts);
    const auto g_copied = sdpa_backward(x, k_copy, v_copy, copied.out, copied.lse, out_copy, opts);
    EXPECT_TRUE(all_close(g_aliased.dq, g_copied.dq, 0.0));
    EXPECT_TRUE(all_close(g_aliased.dk, g_copied.dk, 0.0));
    EXPECT_TRUE(all_close(g_aliased.dv, g_copied.dv, 0.0));
  }
}

// step reads x_new completely (projection) before it writes the cache, so x_new may even view the cache's own
// memory, through a growth of the cache too: the result is that of a copy.
TYPED_TEST(ExtremeInputsTest, StepInputViewingTheCacheItselfEqualsACopy) {
  using T = TypeParam;
  Random random(619);
  MultiHeadAttention<T> mha(ModuleConfig(8, 2), 4);
  auto cache = mha.make_cache(1);
  mha.step(random.normal_tensor<T, 3>({1, 6, 8}), cache);
  KVCache<T> twin = cache;
  // Two "tokens" of width 8 from the first 16 stored key entries (head 0, rows 0..3 of D = 4).
  const TensorView<const T, 3> inside(cache.keys().data(), {1, 2, 8});
  const Tensor<T, 3> copy(inside);
  const Index capacity = cache.capacity();
  const auto from_view = mha.step(inside, cache);
  const auto from_copy = mha.step(copy, twin);
  EXPECT_TRUE(all_close(from_view, from_copy, 0.0));
  EXPECT_TRUE(all_close(cache.keys(), twin.keys(), 0.0));
  EXPECT_GE(cache.capacity(), capacity);
}

}  // namespace
}  // namespace selfattn::test
