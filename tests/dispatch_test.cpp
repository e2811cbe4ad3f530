// Tests of cpu.hpp and detail/dispatch.hpp: the CPU detection and its SELFATTN_ISA override, that a call runs the
// level cpu_info() reports, and the fused float kernels, the decode kernel's three paths and the few-row projection
// of every level this CPU has against the float64 reference and against each other, called level by level in one
// process.
//
// The other kernel tests run at every level too: ctest runs fused_test, fast_paths_test, decode_kernel_test,
// half_precision_test and projection_test once more per level under SELFATTN_ISA (tests/CMakeLists.txt). Built once
// more with -march=native (dispatch_native_test), the generic level is Eigen's AVX-512 packets, and the avx512 level
// must then give bitwise the same results.
#include <selfattn/attention.hpp>
#include <selfattn/cpu.hpp>
#include <selfattn/detail/decode.hpp>
#include <selfattn/detail/dispatch.hpp>

#include "support/random.hpp"
#include "support/sanitizers.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

namespace selfattn {
namespace {

using detail::AttentionParams;
using detail::BackwardTensors;
using detail::ForwardOutputs;

TEST(CpuInfo, BestLevelFollowsTheFlagsAndIsSelectedUnlessOverridden) {
  const CpuInfo& info = cpu_info();
  EXPECT_EQ(info.best, detail::best_level(info));
  const char* env = std::getenv("SELFATTN_ISA");
  if (env == nullptr || *env == '\0') {
    EXPECT_FALSE(info.overridden);
    EXPECT_EQ(info.selected, info.best);
  } else {
    EXPECT_TRUE(info.overridden);
    EXPECT_STREQ(to_string(info.selected), env);
  }
  // Levels imply their parts.
  EXPECT_TRUE(info.best < Isa::avx2 || (info.avx2 && info.fma));
  EXPECT_TRUE(info.best < Isa::avx512 || (info.avx512f && info.avx512bw && info.avx512dq && info.avx512vl));
  EXPECT_TRUE(info.best != Isa::avx512_bf16 || info.avx512_bf16);
#if SELFATTN_DISPATCH_X86
  EXPECT_FALSE(info.vendor.empty());
#endif
  const std::string text = to_string(info);
  EXPECT_NE(text.find(std::string("level: ") + to_string(info.selected)), std::string::npos) << text;
  EXPECT_FALSE(info.kernels.empty());
}

TEST(CpuInfo, OverrideNamesTheValueAndTheLimit) {
  CpuInfo avx2_cpu;
  avx2_cpu.model = "Test CPU";
  avx2_cpu.best = Isa::avx2;
  EXPECT_EQ(detail::parse_isa_override("generic", avx2_cpu), Isa::generic);
  EXPECT_EQ(detail::parse_isa_override("avx2", avx2_cpu), Isa::avx2);
  try {
    detail::parse_isa_override("avx512", avx2_cpu);
    FAIL() << "a level above the CPU's was accepted";
  } catch (const std::invalid_argument& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("SELFATTN_ISA=avx512"), std::string::npos) << message;
    EXPECT_NE(message.find("up to avx2"), std::string::npos) << message;
    EXPECT_NE(message.find("Test CPU"), std::string::npos) << message;
  }
  try {
    detail::parse_isa_override("sse9", avx2_cpu);
    FAIL() << "an unknown level was accepted";
  } catch (const std::invalid_argument& error) {
    EXPECT_NE(std::string(error.what()).find("expected one of generic, avx2, avx512, avx512_bf16"), std::string::npos);
  }
}

TEST(Dispatch, CallsRunTheSelectedLevel) {
  // The forward's blocks are as wide as the selected level's vectors: 4 packets of 16, 8 or Eigen's own width.
  const Isa level = cpu_info().selected;
  const Index expected = level >= Isa::avx512 ? 64 : level == Isa::avx2 ? 32 : detail::FusedTiles<float>::lanes;
  EXPECT_EQ(detail::fused_lanes<float>(), expected) << to_string(level);
  EXPECT_EQ(detail::fused_lanes<double>(), detail::FusedTiles<double>::lanes);  // double is never dispatched
}

/// The seeds 1..seeds(n) of a sweep: all n in an ordinary build, a quarter under a sanitizer (sanitizers.hpp), which
/// still take every mask kind (seed % 3) and both masks of the general decode path (seed % 2).
std::uint64_t seeds(long n) { return static_cast<std::uint64_t>(test::sweep_cases(n)); }

/// One random problem: inputs, options, and the float64 reference of its forward and backward.
struct Problem {
  Tensor<float, 4> q, k, v, dout;
  AttentionOptions<float> opts;
  Tensor<double, 4> out64, dq64, dk64, dv64;
};

Problem make_problem(std::uint64_t seed) {
  test::Random random(seed);
  const Index batch = random.integer(1, 2), kv_heads = random.integer(1, 2), heads = kv_heads * random.integer(1, 2);
  const Index q_len = random.integer(1, 150), k_len = random.integer(1, 150), dim = random.integer(1, 80);
  Problem p;
  p.q = random.normal_tensor<float, 4>({batch, heads, q_len, dim});
  p.k = random.normal_tensor<float, 4>({batch, kv_heads, k_len, dim});
  p.v = random.normal_tensor<float, 4>({batch, kv_heads, k_len, dim});
  p.dout = random.normal_tensor<float, 4>({batch, heads, q_len, dim});
  const int mask = static_cast<int>(seed % 3);
  if (mask == 1) p.opts.causal = Causal::bottom_right;
  if (mask == 2) {
    p.opts.window_left = random.integer(0, 20);
    p.opts.window_right = random.integer(0, 20);
  }
  AttentionOptions<double> opts64;
  opts64.causal = p.opts.causal;
  opts64.window_left = p.opts.window_left;
  opts64.window_right = p.opts.window_right;
  opts64.kernel = Kernel::reference;
  const auto widen = [](const Tensor<float, 4>& x) {
    Tensor<double, 4> y(x.shape());
    for (Index n = 0; n < x.size(); ++n) y.data()[n] = x.data()[n];
    return y;
  };
  const Tensor<double, 4> q = widen(p.q), k = widen(p.k), v = widen(p.v), dout = widen(p.dout);
  auto forward = sdpa_forward(q, k, v, opts64);
  p.out64 = forward.out;
  auto grads = sdpa_backward(q, k, v, forward.out, forward.lse, dout, opts64);
  p.dq64 = grads.dq;
  p.dk64 = grads.dk;
  p.dv64 = grads.dv;
  return p;
}

/// max |x - expected| / max(1, max |expected|).
template <int Rank>
double relative_error(const Tensor<float, Rank>& x, const Tensor<double, Rank>& expected) {
  double error = 0, scale = 1;
  for (Index n = 0; n < x.size(); ++n) {
    error = std::max(error, std::abs(static_cast<double>(x.data()[n]) - expected.data()[n]));
    scale = std::max(scale, std::abs(expected.data()[n]));
  }
  return error / scale;
}

struct LevelResult {
  Tensor<float, 4> out, dq, dk, dv;
};

/// The fused forward and backward of `p` with the kernels of one level (Level: detail, detail::isa_avx2, ...).
template <typename Forward, typename Backward>
LevelResult run_level(const Problem& p, Forward forward, Backward backward) {
  const AttentionParams<float> params = detail::make_params<float>(p.q.view(), p.k.view(), p.v.view(), p.opts);
  LevelResult r{Tensor<float, 4>(p.q.shape()), Tensor<float, 4>(p.q.shape()), Tensor<float, 4>(p.k.shape()),
                Tensor<float, 4>(p.v.shape())};
  Tensor<float, 3> lse({p.q.dim(0), p.q.dim(1), p.q.dim(2)});
  detail::FusedForwardScratch<float> forward_scratch;
  forward(params, ForwardOutputs<float>{r.out.view(), lse.view(), TensorView<float, 4>()}, forward_scratch);
  detail::FusedBackwardScratch<float> backward_scratch;
  backward(params,
           BackwardTensors<float>{r.out.view(), lse.view(), p.dout.view(), r.dq.view(), r.dk.view(), r.dv.view(),
                                  TensorView<float, 4>()},
           backward_scratch);
  return r;
}

template <int Rank>
bool bitwise_equal(const Tensor<float, Rank>& a, const Tensor<float, Rank>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), sizeof(float) * static_cast<std::size_t>(a.size())) == 0;
}

/// Every level this CPU has, against the float64 reference (FlashAttention's float tolerance, 2e-5 here) and, run
/// twice, against itself bitwise.
void check_level(const char* name, const Problem& p, const LevelResult& first, const LevelResult& again) {
  EXPECT_LT(relative_error(first.out, p.out64), 2e-5) << name;
  EXPECT_LT(relative_error(first.dq, p.dq64), 5e-5) << name;
  EXPECT_LT(relative_error(first.dk, p.dk64), 5e-5) << name;
  EXPECT_LT(relative_error(first.dv, p.dv64), 5e-5) << name;
  EXPECT_TRUE(bitwise_equal(first.out, again.out) && bitwise_equal(first.dq, again.dq) &&
              bitwise_equal(first.dk, again.dk) && bitwise_equal(first.dv, again.dv))
      << name << ": two runs differ";
}

TEST(Dispatch, EveryLevelOfThisCpuMatchesTheReference) {
  for (std::uint64_t seed = 1; seed <= seeds(24); ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    const Problem p = make_problem(seed);
    const auto generic = [&] {
      return run_level(
          p, [](auto&&... a) { detail::fused_forward_blocks(a..., detail::ElementProducts<float>{}); },
          [](auto&&... a) { detail::fused_backward_blocks(a...); });
    };
    check_level("generic", p, generic(), generic());
#if SELFATTN_DISPATCH_X86
    if (cpu_info().best >= Isa::avx2) {
      const auto avx2 = [&] {
        return run_level(
            p, [](auto&&... a) { detail::isa_avx2::fused_forward_blocks(a..., detail::isa_avx2::ElementProducts<float>{}); },
            [](auto&&... a) { detail::isa_avx2::fused_backward_blocks(a...); });
      };
      check_level("avx2", p, avx2(), avx2());
    }
    if (cpu_info().best >= Isa::avx512) {
      const auto avx512 = [&] {
        return run_level(
            p,
            [](auto&&... a) {
              detail::isa_avx512::fused_forward_blocks(a..., detail::isa_avx512::ElementProducts<float>{});
            },
            [](auto&&... a) { detail::isa_avx512::fused_backward_blocks(a...); });
      };
      const LevelResult result = avx512();
      check_level("avx512", p, result, avx512());
#if defined(__AVX512F__) && defined(__AVX512DQ__) && defined(__FMA__)
      // Built for AVX-512, the generic level is Eigen's AVX-512 packets: the same instructions in the same order.
      const LevelResult eigen = generic();
      EXPECT_TRUE(bitwise_equal(result.out, eigen.out) && bitwise_equal(result.dq, eigen.dq) &&
                  bitwise_equal(result.dk, eigen.dk) && bitwise_equal(result.dv, eigen.dv))
          << "avx512 and the -march=native generic level differ";
#endif
    }
#endif
  }
}

/// A decode step: few query rows over several chunks of keys stored as KV, and its float64 reference.
template <typename KV>
struct DecodeProblem {
  Tensor<float, 4> q;
  Tensor<KV, 4> k, v;
  Tensor<bool, 4> allowed;  // (B, 1, Lq, Lk) for the general path's problems, else empty
  AttentionOptions<float> opts;
  Tensor<double, 4> out64;

  AttentionOptions<float> options() const {
    AttentionOptions<float> o = opts;
    if (allowed.size() > 0) o.allowed = allowed.view();
    return o;
  }
};

/// with_allowed: an `allowed` mask with about a third of the keys masked, which only the general path takes.
template <typename KV>
DecodeProblem<KV> make_decode_problem(std::uint64_t seed, bool with_allowed) {
  test::Random random(seed);
  const Index batch = random.integer(1, 2), kv_heads = random.integer(1, 2), heads = kv_heads * random.integer(1, 4);
  const Index q_len = random.integer(1, 3), k_len = random.integer(1, 900), dim = random.integer(1, 80);
  DecodeProblem<KV> p;
  p.q = random.normal_tensor<float, 4>({batch, heads, q_len, dim});
  const Tensor<float, 4> k = random.normal_tensor<float, 4>({batch, kv_heads, k_len, dim});
  const Tensor<float, 4> v = random.normal_tensor<float, 4>({batch, kv_heads, k_len, dim});
  p.k = Tensor<KV, 4>(k.shape());
  p.v = Tensor<KV, 4>(v.shape());
  for (Index n = 0; n < k.size(); ++n) p.k.data()[n] = static_cast<KV>(k.data()[n]);
  for (Index n = 0; n < v.size(); ++n) p.v.data()[n] = static_cast<KV>(v.data()[n]);
  const int mask = static_cast<int>(seed % 3);
  if (mask == 1) p.opts.causal = Causal::bottom_right;
  if (mask == 2) p.opts.window_left = random.integer(0, 300);
  AttentionOptions<double> opts64;
  opts64.causal = p.opts.causal;
  opts64.window_left = p.opts.window_left;
  opts64.kernel = Kernel::reference;
  if (with_allowed) {
    p.allowed = Tensor<bool, 4>({batch, 1, q_len, k_len});
    for (Index n = 0; n < p.allowed.size(); ++n) p.allowed.data()[n] = random.integer(0, 2) > 0;
    opts64.allowed = p.allowed.view();
  }
  // The reference on the values the kernels see: the 16-bit ones widened exactly.
  const auto exact = [](const auto& x) {
    Tensor<double, 4> y(x.shape());
    for (Index n = 0; n < x.size(); ++n) y.data()[n] = static_cast<double>(static_cast<float>(x.data()[n]));
    return y;
  };
  p.out64 = sdpa_forward(exact(p.q), exact(p.k), exact(p.v), opts64).out;
  return p;
}

/// One decode path of one level: run(params, outputs, scratch).
template <typename KV, typename Run>
Tensor<float, 4> decode_at_level(const DecodeProblem<KV>& p, Run run) {
  const AttentionOptions<float> opts = p.options();
  const AttentionParams<float, KV> params =
      detail::make_stored_params<float, KV>(p.q.view(), p.k.view(), p.v.view(), opts);
  Tensor<float, 4> out(p.q.shape());
  Tensor<float, 3> lse({p.q.dim(0), p.q.dim(1), p.q.dim(2)});
  detail::DecodeScratch<float> scratch;
  run(params, ForwardOutputs<float>{out.view(), lse.view(), TensorView<float, 4>()}, scratch);
  return out;
}

template <typename KV>
void check_decode_levels(double tolerance) {
  using detail::DecodePath;
  for (std::uint64_t seed = 1; seed <= seeds(18); ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    for (const DecodePath path : {DecodePath::general, DecodePath::grouped, DecodePath::streaming}) {
      SCOPED_TRACE(path == DecodePath::general ? "general" : path == DecodePath::grouped ? "grouped" : "streaming");
      // The general path's problems have an `allowed` mask on every other seed: the masks only it takes.
      const DecodeProblem<KV> p = make_decode_problem<KV>(seed, path == DecodePath::general && seed % 2 == 0);
      const auto generic = [&](const auto& params, const auto& outputs, auto& scratch) {
        detail::run_decode_path(path, params, outputs, scratch);
      };
      const Tensor<float, 4> reference = decode_at_level(p, generic);
      EXPECT_LT(relative_error(reference, p.out64), tolerance) << "generic";
#if SELFATTN_DISPATCH_X86
      if (cpu_info().best >= Isa::avx2) {
        const auto avx2 = [&](const auto& params, const auto& outputs, auto& scratch) {
          detail::isa_avx2::run_decode_path(path, params, outputs, scratch);
        };
        const Tensor<float, 4> result = decode_at_level(p, avx2);
        EXPECT_LT(relative_error(result, p.out64), tolerance) << "avx2";
        EXPECT_TRUE(bitwise_equal(result, decode_at_level(p, avx2))) << "avx2: two runs differ";
      }
      if (cpu_info().best >= Isa::avx512) {
        const auto avx512 = [&](const auto& params, const auto& outputs, auto& scratch) {
          detail::isa_avx512::run_decode_path(path, params, outputs, scratch);
        };
        const Tensor<float, 4> result = decode_at_level(p, avx512);
        EXPECT_LT(relative_error(result, p.out64), tolerance) << "avx512";
        EXPECT_TRUE(bitwise_equal(result, decode_at_level(p, avx512))) << "avx512: two runs differ";
#if defined(__AVX512F__) && defined(__AVX512DQ__) && defined(__FMA__)
        EXPECT_TRUE(bitwise_equal(result, reference)) << "avx512 and the -march=native generic level differ";
#endif
      }
#endif
    }
  }
}

TEST(Dispatch, EveryLevelsDecodePathsMatchTheReference) { check_decode_levels<float>(2e-5); }

TEST(Dispatch, EveryLevelsDecodePathsMatchTheReferenceOnBfloat16Caches) { check_decode_levels<bfloat16>(2e-5); }

TEST(Dispatch, EveryLevelsDecodePathsMatchTheReferenceOnFloat16Caches) { check_decode_levels<float16>(2e-5); }

/// A decode step's projection: a few rows of x times W^T (+ b), W and b stored as S, and its float64 reference.
template <typename S>
struct FewRowsProblem {
  Tensor<float, 2> x;
  Tensor<S, 2> weight;
  Tensor<S, 1> bias;
  Tensor<float, 2> weight_as_float;  // the same values as `weight`, stored as float
  Tensor<float, 1> bias_as_float;
  Tensor<double, 2> y64;
};

template <typename S>
FewRowsProblem<S> make_few_rows_problem(std::uint64_t seed) {
  test::Random random(seed);
  const Index rows = random.integer(1, detail::few_rows_max), in = random.integer(1, 300),
              out = random.integer(1, 200);
  FewRowsProblem<S> p;
  p.x = random.normal_tensor<float, 2>({rows, in});
  const Tensor<float, 2> w = random.normal_tensor<float, 2>({out, in});
  const Tensor<float, 1> b = random.normal_tensor<float, 1>({out});
  p.weight = Tensor<S, 2>(w.shape());
  p.bias = Tensor<S, 1>(b.shape());
  p.weight_as_float = Tensor<float, 2>(w.shape());
  p.bias_as_float = Tensor<float, 1>(b.shape());
  for (Index n = 0; n < w.size(); ++n) {
    p.weight.data()[n] = static_cast<S>(w.data()[n]);
    p.weight_as_float.data()[n] = static_cast<float>(p.weight.data()[n]);
  }
  for (Index n = 0; n < b.size(); ++n) {
    p.bias.data()[n] = static_cast<S>(b.data()[n]);
    p.bias_as_float.data()[n] = static_cast<float>(p.bias.data()[n]);
  }
  p.y64 = Tensor<double, 2>({rows, out});
  for (Index r = 0; r < rows; ++r)
    for (Index o = 0; o < out; ++o) {
      double sum = p.bias_as_float(o);
      for (Index i = 0; i < in; ++i) sum += static_cast<double>(p.x(r, i)) * p.weight_as_float(o, i);
      p.y64(r, o) = sum;
    }
  return p;
}

/// y = x W^T + b by one level's linear_few_rows: run(x_rows, y_rows, rows, in, weight, bias).
template <typename W, typename Run>
Tensor<float, 2> few_rows_at_level(const Tensor<float, 2>& x, const Tensor<W, 2>& weight, const Tensor<W, 1>& bias,
                                   Run run) {
  Tensor<float, 2> y({x.dim(0), weight.dim(0)});
  std::array<const float*, detail::few_rows_max> x_rows{};
  std::array<float*, detail::few_rows_max> y_rows{};
  for (Index r = 0; r < x.dim(0); ++r) {
    x_rows[static_cast<std::size_t>(r)] = x.data() + r * x.dim(1);
    y_rows[static_cast<std::size_t>(r)] = y.data() + r * y.dim(1);
  }
  run(x_rows, y_rows, x.dim(0), x.dim(1), TensorView<const W, 2>(weight), TensorView<const W, 1>(bias));
  return y;
}

/// Each level's few-row projection against the float64 reference, run twice bitwise, and with the weights stored as
/// S bitwise equal to the same values stored as float (the widening is exact and the order of the sums the same).
template <typename S>
void check_few_rows_levels() {
  for (std::uint64_t seed = 1; seed <= seeds(24); ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    const FewRowsProblem<S> p = make_few_rows_problem<S>(seed);
    const auto check = [&](const char* name, auto run) {
      const Tensor<float, 2> y = few_rows_at_level(p.x, p.weight, p.bias, run);
      EXPECT_LT(relative_error(y, p.y64), 1e-5) << name;
      EXPECT_TRUE(bitwise_equal(y, few_rows_at_level(p.x, p.weight, p.bias, run))) << name << ": two runs differ";
      EXPECT_TRUE(bitwise_equal(y, few_rows_at_level(p.x, p.weight_as_float, p.bias_as_float, run)))
          << name << ": the stored weights and the same values in float differ";
      return y;
    };
    const Tensor<float, 2> generic =
        check("generic", [](auto&&... a) { detail::linear_few_rows<float>(a...); });
#if SELFATTN_DISPATCH_X86
    if (cpu_info().best >= Isa::avx2)
      check("avx2", [](auto&&... a) { detail::isa_avx2::linear_few_rows<float>(a...); });
    if (cpu_info().best >= Isa::avx512) {
      const Tensor<float, 2> avx512 =
          check("avx512", [](auto&&... a) { detail::isa_avx512::linear_few_rows<float>(a...); });
#if defined(__AVX512F__) && defined(__AVX512DQ__) && defined(__FMA__)
      EXPECT_TRUE(bitwise_equal(avx512, generic)) << "avx512 and the -march=native generic level differ";
#endif
    }
#endif
    static_cast<void>(generic);
  }
}

TEST(Dispatch, EveryLevelsFewRowProjectionMatchesTheReference) { check_few_rows_levels<float>(); }

TEST(Dispatch, EveryLevelsFewRowProjectionMatchesTheReferenceOnBfloat16Weights) { check_few_rows_levels<bfloat16>(); }

TEST(Dispatch, EveryLevelsFewRowProjectionMatchesTheReferenceOnFloat16Weights) { check_few_rows_levels<float16>(); }

}  // namespace
}  // namespace selfattn
