// Half-width storage (selfattn/half_precision.hpp and the 16-bit paths of attention.hpp, the decode kernel and the
// KV cache), for bfloat16 and float16:
//   - conversions: round to nearest even (ties, overflow, NaN), exact widening, the SIMD widening of the decode
//     kernels lane for lane against the scalar one;
//   - the 16-bit paths compute what the float kernels compute on the widened inputs, bitwise: every decode path
//     with keys and values read in place, the fused and reference kernels through the public entries;
//   - accuracy, FlashAttention's rule: against the float64 reference on the same 16-bit inputs, the error of the
//     16-bit result is at most twice that of a float reference computing from the same inputs and storing its
//     result in 16 bits; over the sweep's shapes (GQA, MQA, Lq != Lk) and every mask kind, forward (out, lse,
//     weights) and backward (dq, dk, dv, dbias), fully masked rows giving 0 and -inf;
//   - the 16-bit KV cache: appended rows rounded once (bitwise the float cache's rows rounded), eviction with
//     sinks, half the memory, and the module's steps over it;
//   - errors name the argument before anything is written.
// ctest runs it once per instruction-set level (SELFATTN_ISA, tests/CMakeLists.txt): the widening of each level
// (SSE2 unpack or lane by lane at generic, AVX2 and F16C, AVX-512) and, at avx512_bf16, the BF16 dot products.
#include <selfattn/selfattn.hpp>

#include "support/compare.hpp"
#include "support/expect_error.hpp"
#include "support/level_copy.hpp"
#include "support/module_config.hpp"
#include "support/random.hpp"
#include "support/sanitizers.hpp"
#include "support/sweep.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

namespace selfattn::test {
namespace {

template <typename S>
class HalfPrecisionTest : public ::testing::Test {};
using HalfTypes = ::testing::Types<bfloat16, float16>;
TYPED_TEST_SUITE(HalfPrecisionTest, HalfTypes, );

template <typename S>
std::uint16_t bits_of(S x) {
  std::uint16_t raw;
  std::memcpy(&raw, &x, sizeof raw);
  return raw;
}
template <typename S>
S from_bits(std::uint16_t raw) {
  S x;
  std::memcpy(static_cast<void*>(&x), &raw, sizeof raw);
  return x;
}
float float_from_bits(std::uint32_t raw) {
  float x;
  std::memcpy(&x, &raw, sizeof raw);
  return x;
}

// Every 16-bit pattern once, widened by tensor_cast, equals the exact value Eigen's scalar conversion gives (NaN
// stays NaN), and narrows back to the same bits (NaN to a NaN).
TYPED_TEST(HalfPrecisionTest, WideningIsExactAndNarrowingRoundTrips) {
  using S = TypeParam;
  Tensor<S, 1> all({65536});
  for (Index i = 0; i < 65536; ++i) all.data()[i] = from_bits<S>(static_cast<std::uint16_t>(i));
  const Tensor<float, 1> wide = tensor_cast<float>(all);
  const Tensor<double, 1> wider = tensor_cast<double>(all);
  const Tensor<S, 1> back = tensor_cast<S>(wide);
  for (Index i = 0; i < 65536; ++i) {
    const float expected = static_cast<float>(all.data()[i]);
    if (std::isnan(expected)) {
      EXPECT_TRUE(std::isnan(wide.data()[i]) && std::isnan(wider.data()[i])) << "pattern " << i;
      EXPECT_TRUE(std::isnan(static_cast<float>(back.data()[i]))) << "pattern " << i;
      continue;
    }
    ASSERT_EQ(wide.data()[i], expected) << "pattern " << i;
    ASSERT_EQ(wider.data()[i], static_cast<double>(expected)) << "pattern " << i;
    ASSERT_EQ(bits_of(back.data()[i]), static_cast<std::uint16_t>(i)) << "pattern " << i;
  }
}

// Round to nearest, ties to even, overflow to infinity, built from bit patterns.
TEST(HalfPrecisionRounding, BFloat16TiesGoToEven) {
  Tensor<float, 1> x({6});
  x(0) = float_from_bits(0x3F808000u);  // 1 + 2^-8: halfway between 1 and 1 + 2^-7 -> 1 (even)
  x(1) = float_from_bits(0x3F818000u);  // 1 + 3 * 2^-8: halfway between 1 + 2^-7 and 1 + 2^-6 -> 1 + 2^-6 (even)
  x(2) = float_from_bits(0x3F808001u);  // just above the first tie -> up
  x(3) = std::numeric_limits<float>::max();  // rounds past the largest bfloat16 -> inf
  x(4) = std::numeric_limits<float>::quiet_NaN();
  x(5) = float_from_bits(0x00000001u);  // the smallest float subnormal -> +0
  const Tensor<bfloat16, 1> y = tensor_cast<bfloat16>(x);
  EXPECT_EQ(bits_of(y(0)), 0x3F80);
  EXPECT_EQ(bits_of(y(1)), 0x3F82);
  EXPECT_EQ(bits_of(y(2)), 0x3F81);
  EXPECT_EQ(bits_of(y(3)), 0x7F80);
  EXPECT_TRUE(std::isnan(static_cast<float>(y(4))));
  EXPECT_EQ(bits_of(y(5)), 0x0000);
}

TEST(HalfPrecisionRounding, Float16TiesGoToEvenAndOverflowsToInfinity) {
  Tensor<double, 1> x({6});
  x(0) = 1.0 + std::ldexp(1.0, -11);      // halfway between 1 and 1 + 2^-10 -> 1 (even)
  x(1) = 1.0 + 3 * std::ldexp(1.0, -11);  // -> 1 + 2^-9 (even)
  x(2) = 65519.0;                         // below the halfway point to 65536: the largest finite, 65504
  x(3) = 65520.0;                         // the tie between 65504 and 65536 (not representable) -> inf
  x(4) = -std::ldexp(1.0, -25);           // half the smallest subnormal: a tie -> -0 (even)
  x(5) = 1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40);  // just above the tie: up, rounded once (through a
                                                              // float first it would be a tie, then 1)
  const Tensor<float16, 1> y = tensor_cast<float16>(x);
  EXPECT_EQ(bits_of(y(0)), 0x3C00);
  EXPECT_EQ(bits_of(y(1)), 0x3C02);
  EXPECT_EQ(bits_of(y(2)), 0x7BFF);
  EXPECT_EQ(bits_of(y(3)), 0x7C00);
  EXPECT_EQ(bits_of(y(4)), 0x8000);
  EXPECT_EQ(bits_of(y(5)), 0x3C01);
}

// The packet widening of the decode kernels (detail/kernels/widen.inc: SIMD where the target has it) against the scalar
// widening, lane for lane, over every 16-bit pattern.
TYPED_TEST(HalfPrecisionTest, PacketWideningMatchesScalarWidening) {
  using S = TypeParam;
  constexpr Index ps = detail::micro::packet_size<float>;
  std::vector<S> all(65536 + ps);
  for (std::size_t i = 0; i < all.size(); ++i) all[i] = from_bits<S>(static_cast<std::uint16_t>(i));
  alignas(64) float lanes[ps];
  for (Index i = 0; i < 65536; i += ps) {
    Eigen::internal::pstore(lanes, detail::micro::load_widened<float>(all.data() + i));
    for (Index l = 0; l < ps; ++l) {
      const float expected = detail::widen<float>(all[static_cast<std::size_t>(i + l)]);
      if (std::isnan(expected)) {
        ASSERT_TRUE(std::isnan(lanes[l])) << "pattern " << i + l;
      } else {
        ASSERT_EQ(lanes[l], expected) << "pattern " << i + l;
      }
    }
  }
}

// A random attention call of a sweep shape and mask kind, in three precisions: the 16-bit inputs, the same values
// widened to float, and to double.
template <typename S>
struct HalfCall {
  test::Shape shape;
  Tensor<S, 4> q, k, v, dout;
  test::MaskedOptions<float> masks;  // the options of the 16-bit and float calls (bias in float)
  AttentionOptions<double> opts64;   // the same masks for the double reference
  Tensor<double, 4> bias64;

  HalfCall(const test::Shape& s, MaskKind kind, Random& random) : shape(s) {
    q = tensor_cast<S>(random.normal_tensor<float, 4>({s.batch, s.heads, s.q_len, s.head_dim}));
    k = tensor_cast<S>(random.normal_tensor<float, 4>({s.batch, s.kv_heads, s.k_len, s.head_dim}));
    v = tensor_cast<S>(random.normal_tensor<float, 4>({s.batch, s.kv_heads, s.k_len, s.value_dim}));
    dout = tensor_cast<S>(random.normal_tensor<float, 4>({s.batch, s.heads, s.q_len, s.value_dim}));
    test::make_options(kind, s, random, masks);
    masks.opts.need_weights = false;
    const AttentionOptions<float>& o = masks.opts;
    opts64.causal = o.causal;
    opts64.key_lengths = o.key_lengths;
    opts64.allowed = o.allowed;
    if (o.bias.data()) {
      bias64 = tensor_cast<double>(masks.bias);
      opts64.bias = bias64;
    }
    opts64.window_left = o.window_left;
    opts64.window_right = o.window_right;
    for (float slope : o.alibi_slopes) opts64.alibi_slopes.push_back(slope);
    if (o.scale) opts64.scale = static_cast<double>(*o.scale);
  }
};

// FlashAttention's rule on one result: |ours - truth| <= 2 |baseline - truth| (worst elements), with a floor of one
// float rounding of the largest |truth| so that an exact baseline (a row of one key) does not demand exactness.
template <typename A, typename B, typename E>
::testing::AssertionResult within_twice_baseline(const A& ours, const B& baseline, const E& truth) {
  const Tensor<double, 4> ours64 = tensor_cast<double>(ours), baseline64 = tensor_cast<double>(baseline);
  const Tensor<double, 4> truth64 = tensor_cast<double>(truth);
  if (test::has_nan(ours64)) return ::testing::AssertionFailure() << "NaN in the result";
  double scale = 0.0;
  for (Index n = 0; n < truth64.size(); ++n) scale = std::max(scale, std::abs(truth64.data()[n]));
  const double error = test::max_abs_difference(ours64, truth64);
  const double baseline_error = test::max_abs_difference(baseline64, truth64);
  const double bound = 2.0 * baseline_error + scale * std::numeric_limits<float>::epsilon();
  if (error <= bound)
    return ::testing::AssertionSuccess() << "error " << error << ", baseline " << baseline_error;
  return ::testing::AssertionFailure() << "error " << error << " > 2 x baseline error " << baseline_error
                                       << " (+ floor " << scale * std::numeric_limits<float>::epsilon() << ")";
}

// Forward, over the sweep's shapes and every mask kind, on the automatic kernel (fused, or decode for few query
// rows) and forced onto each of reference, fused and decode: out within twice the baseline's error, lse and the
// weights (float) within float tolerance of the double reference, fully masked rows exactly 0 with lse -inf.
TYPED_TEST(HalfPrecisionTest, ForwardFollowsTheFlashAttentionRuleOnEveryMaskKind) {
  using S = TypeParam;
  Random random(1613);
  int checked = 0;
  for (const test::Shape& shape : test::sweep_shapes)
    for (MaskKind kind : test::mask_kinds) {
      const HalfCall<S> call(shape, kind, random);
      AttentionOptions<double> reference64 = call.opts64;
      reference64.kernel = Kernel::reference;
      reference64.need_weights = true;
      const auto truth = sdpa_forward(tensor_cast<double>(call.q), tensor_cast<double>(call.k),
                                      tensor_cast<double>(call.v), reference64);
      AttentionOptions<float> reference32 = call.masks.opts;
      reference32.kernel = Kernel::reference;
      const Tensor<S, 4> baseline = tensor_cast<S>(
          sdpa_forward(tensor_cast<float>(call.q), tensor_cast<float>(call.k), tensor_cast<float>(call.v), reference32)
              .out);
      for (Kernel kernel : {Kernel::automatic, Kernel::reference, Kernel::fused, Kernel::decode}) {
        if (kernel == Kernel::decode && shape.q_len > detail::decode_max_query_rows) continue;
        AttentionOptions<float> opts = call.masks.opts;
        opts.kernel = kernel;
        opts.need_weights = kernel == Kernel::reference;
        const AttentionForward<S> result = sdpa_forward(call.q, call.k, call.v, opts);
        const std::string where = "shape " + detail::shape_string<4>(call.q.shape()) + " k " +
                                  detail::shape_string<4>(call.k.shape()) + " mask kind " +
                                  std::to_string(static_cast<int>(kind)) + " kernel " +
                                  std::to_string(static_cast<int>(kernel));
        EXPECT_TRUE(within_twice_baseline(result.out, baseline, truth.out)) << where;
        EXPECT_TRUE(test::all_close(result.lse, truth.lse, test::default_tolerance<float>())) << where;
        if (opts.need_weights) {
          EXPECT_TRUE(test::all_close(result.weights, truth.weights, test::default_tolerance<float>())) << where;
        }
        for (Index n = 0; n < truth.lse.size(); ++n)
          if (std::isinf(truth.lse.data()[n])) {  // a row without keys: 0, never NaN
            EXPECT_TRUE(std::isinf(result.lse.data()[n]) && result.lse.data()[n] < 0) << where;
            const Index row = n * shape.value_dim;
            for (Index e = 0; e < shape.value_dim; ++e)
              EXPECT_EQ(static_cast<float>(result.out.data()[row + e]), 0.0f) << where;
          }
        ++checked;
      }
    }
  EXPECT_GT(checked, 300);
}

// The 16-bit entries compute exactly what the float kernels compute on the widened inputs, then round out once:
// bitwise, for the fused kernel (inputs widened once) and the decode kernel (keys and values read in place). Not
// the fused kernel on bfloat16 where the BF16 dot products are chosen for this CPU: it has its own
// tests below.
TYPED_TEST(HalfPrecisionTest, PublicPathsEqualTheFloatKernelsOnWidenedInputs) {
  using S = TypeParam;
  Random random(77);
  for (Kernel kernel : {Kernel::fused, Kernel::decode})
    for (const test::Shape& shape : test::sweep_shapes) {
      if (kernel == Kernel::decode && shape.q_len > detail::decode_max_query_rows) continue;
      const bool bf16_products = detail::micro::has_bf16_dot && detail::bfloat16_products();
      if (kernel == Kernel::fused && std::is_same_v<S, bfloat16> && bf16_products) continue;
      const HalfCall<S> call(shape, MaskKind::everything, random);
      AttentionOptions<float> opts = call.masks.opts;
      opts.kernel = kernel;
      const AttentionForward<S> half = sdpa_forward(call.q, call.k, call.v, opts);
      const AttentionForward<float> wide =
          sdpa_forward(tensor_cast<float>(call.q), tensor_cast<float>(call.k), tensor_cast<float>(call.v), opts);
      const Tensor<S, 4> rounded = tensor_cast<S>(wide.out);
      for (Index n = 0; n < rounded.size(); ++n)
        ASSERT_EQ(bits_of(half.out.data()[n]), bits_of(rounded.data()[n])) << "element " << n;
      for (Index n = 0; n < wide.lse.size(); ++n)
        ASSERT_EQ(half.lse.data()[n], wide.lse.data()[n]) << "lse " << n;
    }
}

// The fused kernel reads 16-bit q, k and v in place and rounds out row by row into the caller's memory: views with
// spare elements after each row (pad 1: odd strides, so the BF16 dot products pack the keys; pad 2: even strides,
// read in place) and a strided out give bitwise the results of the same call on contiguous copies, at every level.
TYPED_TEST(HalfPrecisionTest, FusedForwardReadsAndWritesStridedViews) {
  using S = TypeParam;
  Random random(404);
  const Index B = 2, H = 4, Hkv = 2, Lq = 70, Lk = 90, D = 64;
  for (Index pad : {1, 2}) {
    const Tensor<S, 4> q_plane = tensor_cast<S>(random.normal_tensor<float, 4>({B, H, Lq, D + pad}));
    const Tensor<S, 4> k_plane = tensor_cast<S>(random.normal_tensor<float, 4>({B, Hkv, Lk, D + pad}));
    const Tensor<S, 4> v_plane = tensor_cast<S>(random.normal_tensor<float, 4>({B, Hkv, Lk, D + pad}));
    const TensorView<const S, 4> q(q_plane.data(), {B, H, Lq, D}, q_plane.strides());
    const TensorView<const S, 4> k(k_plane.data(), {B, Hkv, Lk, D}, k_plane.strides());
    const TensorView<const S, 4> v(v_plane.data(), {B, Hkv, Lk, D}, v_plane.strides());
    Tensor<S, 4> out_plane({B, H, Lq, D + pad});
    const TensorView<S, 4> out(out_plane.data(), {B, H, Lq, D}, out_plane.strides());
    Tensor<float, 3> lse({B, H, Lq});
    AttentionOptions<float> opts;
    opts.kernel = Kernel::fused;
    opts.causal = Causal::bottom_right;
    sdpa_forward_into(q, k, v, out, lse.view(), opts);
    const AttentionForward<S> dense = sdpa_forward(tensor_cast<S>(q), tensor_cast<S>(k), tensor_cast<S>(v), opts);
    for (Index b = 0; b < B; ++b)
      for (Index h = 0; h < H; ++h)
        for (Index i = 0; i < Lq; ++i) {
          ASSERT_EQ(lse(b, h, i), dense.lse(b, h, i)) << "pad " << pad << " lse " << b << " " << h << " " << i;
          for (Index d = 0; d < D; ++d)
            ASSERT_EQ(bits_of(out(b, h, i, d)), bits_of(dense.out(b, h, i, d)))
                << "pad " << pad << " out " << b << " " << h << " " << i << " " << d;
        }
  }
}

// Each decode path (general, grouped, streaming) on keys and values stored in 16 bits equals the same path on the
// widened keys and values to float rounding (1e-6; bitwise but for FMA contraction in scalar tails): the kernels
// read the cache in place and widen it exactly (a wrong widening is off by 1e-3 or more). Key counts around
// the 256-key chunks, group sizes 1..8, head dims that are and are not whole packets, strided cache views.
TYPED_TEST(HalfPrecisionTest, DecodePathsReadSixteenBitKeysAndValuesInPlace) {
  using S = TypeParam;
  using detail::DecodePath;
  Random random(4242);
  std::size_t index = 0;
  for (DecodePath path : {DecodePath::general, DecodePath::grouped, DecodePath::streaming})
    for (Index D : {1, 7, 64, 128})
      for (Index group : {1, 3, 8})
        for (Index Lk : {1, 255, 257, 600}) {
          if (!test::sweep_case_runs(index++)) continue;  // a third of the cases under a sanitizer
          const Index B = 2, Hkv = 2, H = group * Hkv, Lq = group == 1 ? 2 : 1, capacity = Lk + 5;
          const Tensor<float, 4> q = random.normal_tensor<float, 4>({B, H, Lq, D});
          // A cache with spare rows: the views are strided along the sequence like KVCache::sequence_keys.
          const Tensor<S, 4> k_plane = tensor_cast<S>(random.normal_tensor<float, 4>({B, Hkv, capacity, D}));
          const Tensor<S, 4> v_plane = tensor_cast<S>(random.normal_tensor<float, 4>({B, Hkv, capacity, D}));
          const TensorView<const S, 4> k(k_plane.data(), {B, Hkv, Lk, D}, k_plane.strides());
          const TensorView<const S, 4> v(v_plane.data(), {B, Hkv, Lk, D}, v_plane.strides());
          const Tensor<float, 4> k_wide = tensor_cast<float>(k), v_wide = tensor_cast<float>(v);
          AttentionOptions<float> opts;
          opts.causal = Causal::bottom_right;
          if (path == DecodePath::general) opts.key_lengths = {Lk, std::max<Index>(1, Lk / 2)};
          if (path == DecodePath::general) opts.dropout_p = 0.25f;
          const auto half_params = detail::make_stored_params<float, S>(q, k, v, opts);
          const auto wide_params = detail::make_params<float>(q, k_wide, v_wide, opts);
          Tensor<float, 4> out_half({B, H, Lq, D}), out_wide({B, H, Lq, D});
          Tensor<float, 3> lse_half({B, H, Lq}), lse_wide({B, H, Lq});
          detail::decode_forward(half_params, detail::ForwardOutputs<float>{out_half.view(), lse_half.view(), {}}, path);
          detail::decode_forward(wide_params, detail::ForwardOutputs<float>{out_wide.view(), lse_wide.view(), {}}, path);
          const std::string where = "path " + std::to_string(static_cast<int>(path)) + " D " + std::to_string(D) +
                                    " G " + std::to_string(group) + " Lk " + std::to_string(Lk);
          // The same arithmetic on the same floats; the compiler may contract a scalar tail's a * b + c into an FMA
          // in one instantiation and not the other (seen with -march=native, D = 1), so: float rounding, not bits.
          ASSERT_TRUE(test::all_close(out_half, out_wide, 1e-6)) << where;
          ASSERT_TRUE(test::all_close(lse_half, lse_wide, 1e-6)) << where;
        }
}

// The fused kernel on BF16 dot products (detail/fused_forward_bf16.hpp): run at the avx512_bf16 level on a CPU where
// they beat the FMA (bfloat16_products()); elsewhere, and at the levels below (SELFATTN_ISA), the bfloat16 fused
// forward widens its inputs and the tests below check that path on the same cases.

// FlashAttention's rule for the fused kernel on bfloat16 beyond the sweep's shapes: several key tiles and query
// blocks, odd D and odd Lk (pairs padded with 0), windows starting at odd keys (tiles start at even ones), GQA,
// dropout, every mask kind; lse within float tolerance; fully masked rows 0 with lse -inf.
TEST(HalfPrecisionBf16Fused, FollowsTheFlashAttentionRuleOverTilesAndMasks) {
  Random random(2718);
  const std::vector<test::Shape> shapes = {
      {1, 2, 1, 130, 301, 63, 17}, {2, 4, 2, 70, 129, 64, 64}, {1, 2, 2, 65, 64, 1, 3}, {1, 1, 1, 200, 200, 128, 128}};
  int checked = 0;
  for (std::size_t s = 0; s < shapes.size(); ++s)
    for (std::size_t m = 0; m < std::size(test::mask_kinds); ++m)
      for (bool dropout : {false, true}) {
        const test::Shape& shape = shapes[s];
        const MaskKind kind = test::mask_kinds[m];
        if (dropout && kind != MaskKind::causal_bottom_right && kind != MaskKind::everything) continue;
        HalfCall<bfloat16> call(shape, kind, random);  // drawn in every build: the kept cases see the same data
        if (!test::sweep_pair_runs(s, m)) continue;     // a third of the pairs under a sanitizer
        AttentionOptions<float> opts = call.masks.opts;
        if (dropout) {
          opts.dropout_p = 0.2f;
          opts.seed = 99;
          call.opts64.dropout_p = 0.2;
          call.opts64.seed = 99;
        }
        AttentionOptions<double> reference64 = call.opts64;
        reference64.kernel = Kernel::reference;
        const auto truth = sdpa_forward(tensor_cast<double>(call.q), tensor_cast<double>(call.k),
                                        tensor_cast<double>(call.v), reference64);
        AttentionOptions<float> reference32 = opts;
        reference32.kernel = Kernel::reference;
        const Tensor<bfloat16, 4> baseline = tensor_cast<bfloat16>(
            sdpa_forward(tensor_cast<float>(call.q), tensor_cast<float>(call.k), tensor_cast<float>(call.v), reference32)
                .out);
        opts.kernel = Kernel::fused;
        const AttentionForward<bfloat16> result = sdpa_forward(call.q, call.k, call.v, opts);
        const std::string where = "shape " + detail::shape_string<4>(call.q.shape()) + " k " +
                                  detail::shape_string<4>(call.k.shape()) + " mask kind " +
                                  std::to_string(static_cast<int>(kind)) + (dropout ? " dropout" : "");
        EXPECT_TRUE(within_twice_baseline(result.out, baseline, truth.out)) << where;
        EXPECT_TRUE(test::all_close(result.lse, truth.lse, test::default_tolerance<float>())) << where;
        for (Index n = 0; n < truth.lse.size(); ++n)
          if (std::isinf(truth.lse.data()[n])) {
            EXPECT_TRUE(std::isinf(result.lse.data()[n]) && result.lse.data()[n] < 0) << where;
            for (Index e = 0; e < shape.value_dim; ++e)
              EXPECT_EQ(static_cast<float>(result.out.data()[n * shape.value_dim + e]), 0.0f) << where;
          }
        ++checked;
      }
  EXPECT_EQ(checked, test::sanitized ? 21 : 4 * (13 + 2));  // 13 mask kinds and 2 with dropout, per shape
}

// Where the BF16 dot products are chosen, the fused forward on bfloat16 runs on them: its output differs from the
// float kernel's on the widened inputs (P rounded to bfloat16 moves a few outputs by an ulp) while following the
// rule above. Where they are not, it is that float kernel, bitwise.
TEST(HalfPrecisionBf16Fused, RunsOnDotProductsWhereCompiled) {
  Random random(31);
  const HalfCall<bfloat16> call({1, 2, 2, 96, 200, 64, 64}, MaskKind::none, random);
  AttentionOptions<float> opts = call.masks.opts;
  opts.kernel = Kernel::fused;
  const AttentionForward<bfloat16> half = sdpa_forward(call.q, call.k, call.v, opts);
  const Tensor<bfloat16, 4> wide =
      tensor_cast<bfloat16>(sdpa_forward(tensor_cast<float>(call.q), tensor_cast<float>(call.k),
                                         tensor_cast<float>(call.v), opts)
                                .out);
  Index differing = 0;
  for (Index n = 0; n < wide.size(); ++n) differing += bits_of(half.out.data()[n]) != bits_of(wide.data()[n]);
  if (detail::micro::has_bf16_dot && detail::bfloat16_products())
    EXPECT_GT(differing, 0) << "the BF16 dot products are chosen but the output is the float kernel's";
  else
    EXPECT_EQ(differing, 0);
}

// Values holding inf or NaN (here in keys every row masks out) send the bfloat16 fused forward to the float kernel,
// whose products skip zero factors: bitwise the float kernel's output on the widened inputs, no NaN.
TEST(HalfPrecisionBf16Fused, ValuesWithInfOrNaNTakeTheFloatKernel) {
  Random random(5);
  HalfCall<bfloat16> call({2, 2, 1, 70, 90, 16, 16}, MaskKind::none, random);
  AttentionOptions<float> opts;
  opts.kernel = Kernel::fused;
  opts.key_lengths = {80, 85};  // keys from 80 (batch 0) and 85 (batch 1) on are masked in every row
  for (Index d = 0; d < 16; ++d) {
    call.v(0, 0, 83, d) = bfloat16(std::numeric_limits<float>::quiet_NaN());
    call.v(1, 0, 88, d) = bfloat16(std::numeric_limits<float>::infinity());
  }
  const AttentionForward<bfloat16> half = sdpa_forward(call.q, call.k, call.v, opts);
  const Tensor<bfloat16, 4> wide =
      tensor_cast<bfloat16>(sdpa_forward(tensor_cast<float>(call.q), tensor_cast<float>(call.k),
                                         tensor_cast<float>(call.v), opts)
                                .out);
  EXPECT_FALSE(test::has_nan(tensor_cast<float>(half.out)));
  for (Index n = 0; n < wide.size(); ++n)
    ASSERT_EQ(bits_of(half.out.data()[n]), bits_of(wide.data()[n])) << "element " << n;
}

// linear_into_stored with 16-bit weights and biases: a few rows (a decode step) read them in place, a packet at a
// time (the SIMD widening in the native build), within float rounding of linear_into on the widened weights; 16
// rows or more widen them once and run the same GEMM: bitwise. Strided rows (a batch with spare rows), In that is
// and is not a whole number of packets, with and without a bias.
TYPED_TEST(HalfPrecisionTest, LinearReadsSixteenBitWeights) {
  using S = TypeParam;
  Random random(21);
  for (Index rows : {1, 2, 5, 15, 16, 33})
    for (Index in : {1, 37, 64, 130})
      for (bool with_bias : {false, true}) {
        const Index out_features = 19, batch = 2, length = (rows + 1) / 2;
        const Tensor<float, 3> x_plane = random.normal_tensor<float, 3>({batch, length + 1, in});
        const TensorView<const float, 3> x(x_plane.data(), {batch, length, in}, x_plane.strides());
        const Tensor<S, 2> weight = tensor_cast<S>(random.normal_tensor<float, 2>({out_features, in}));
        const Tensor<S, 1> bias = with_bias ? tensor_cast<S>(random.normal_tensor<float, 1>({out_features})) : Tensor<S, 1>();
        const Tensor<float, 2> weight_wide = tensor_cast<float>(weight);
        const Tensor<float, 1> bias_wide = tensor_cast<float>(bias);
        Tensor<float, 3> y({batch, length, out_features}), expected({batch, length, out_features});
        detail::StackedProjection<float> scratch;
        detail::linear_into_stored<float, S>(x, weight.view(), bias.view(), y.view(), scratch);
        detail::linear_into<float>(x, weight_wide.view(), bias_wide.view(), expected.view());
        const std::string where = "rows " + std::to_string(batch * length) + " in " + std::to_string(in);
        if (batch * length >= detail::fused_projection_min_rows) {
          for (Index n = 0; n < y.size(); ++n) ASSERT_EQ(y.data()[n], expected.data()[n]) << where << " element " << n;
        } else {
          ASSERT_TRUE(test::all_close(y, expected, 1e-5)) << where;
        }
      }
}

// MultiHeadAttention::step_with on 16-bit parameters (params_cast) equals step_with on float parameters holding the
// same values, bitwise: a prompt of 20 rows (the widened GEMM), then single tokens for two sequences (the
// in-place products), GQA, biases, RoPE, over a float and a 16-bit cache; step_into_with writes bitwise what
// step_with returns; the parameters are the argument's (another module's params() never enter); wrong shapes name
// the tensor before the cache changes.
TYPED_TEST(HalfPrecisionTest, ModuleStepsWithSixteenBitParameters) {
  using S = TypeParam;
  MultiHeadAttentionConfig cfg = ModuleConfig(48, 4).kv_heads(2).rope(12);
  const MultiHeadAttention<float> source(cfg, 7), other(cfg, 8);
  const MhaParams<S> half = params_cast<S>(source.params());
  const MhaParams<float> wide = params_cast<float>(half);
  EXPECT_EQ(half.q_bias.size(), 48);
  Random random(9);
  KVCache<float, S> cache_half = other.make_cache<S>(2), cache_wide = other.make_cache<S>(2);
  KVCache<float, S> cache_into = other.make_cache<S>(2);
  KVCache<float> float_cache_half = other.make_cache(2), float_cache_wide = other.make_cache(2);
  const auto expect_bitwise = [](const Tensor<float, 3>& got, const Tensor<float, 3>& expected) {
    ASSERT_EQ(got.shape(), expected.shape());
    for (Index n = 0; n < got.size(); ++n) ASSERT_EQ(got.data()[n], expected.data()[n]) << "element " << n;
  };
  const Tensor<float, 3> prompt = random.normal_tensor<float, 3>({2, 10, 48});  // 20 rows: the weights widened
  expect_bitwise(other.step_with(half, prompt, cache_half), source.step_with(wide, prompt, cache_wide));
  other.step_with(half, prompt, cache_into);
  expect_bitwise(other.step_with(half, prompt, float_cache_half), source.step_with(wide, prompt, float_cache_wide));
  for (int t = 0; t < 4; ++t) {  // 2 rows: the weights read in place
    SCOPED_TRACE("step " + std::to_string(t));
    const Tensor<float, 3> token = random.normal_tensor<float, 3>({2, 1, 48});
    const Tensor<float, 3> expected = source.step_with(wide, token, cache_wide);
    Tensor<float, 3> into({2, 1, 48});
    other.step_into_with(half, token, cache_into, into.view());
    const Tensor<float, 3> got = other.step_with(half, token, cache_half);
    expect_bitwise(got, expected);
    expect_bitwise(into, got);
    expect_bitwise(other.step_with(half, token, float_cache_half), source.step_with(wide, token, float_cache_wide));
  }
  MhaParams<S> wrong = half;
  wrong.k_weight = Tensor<S, 2>({24, 47});
  const std::vector<Index> lengths = cache_half.lengths();
  test::expect_error<ShapeError>([&] { other.step_with(wrong, random.normal_tensor<float, 3>({2, 1, 48}), cache_half); },
                                 {"MultiHeadAttention::step", "k_weight", "(24, 47)"});
  EXPECT_EQ(cache_half.lengths(), lengths);
}

// MultiHeadAttention::forward_into_with on 16-bit parameters against forward_into of a module holding the same values
// in float: bitwise, with 16 rows or more (weights widened once) and with fewer (read in place), for self- and
// cross-attention; errors name the parameter and write nothing.
TYPED_TEST(HalfPrecisionTest, ModuleForwardIntoWithSixteenBitParameters) {
  using S = TypeParam;
  Random random(17);
  for (const bool self : {true, false}) {
    SCOPED_TRACE(self ? "self-attention" : "cross-attention");
    MultiHeadAttentionConfig cfg = ModuleConfig(48, 4).kv_heads(2).rope(12);
    if (!self) cfg.kdim = cfg.vdim = 20;
    const MultiHeadAttention<float> mha(cfg, 7);
    const MhaParams<S> half = params_cast<S>(mha.params());
    MultiHeadAttention<float> rounded(cfg, 8);
    rounded.params() = params_cast<float>(half);
    AttentionOptions<float> opts;
    opts.causal = Causal::bottom_right;
    MhaWorkspace<float> ws, ws_rounded;
    for (const Index q_len : {Index(10), Index(1)}) {  // 20 rows (widened), then 2 (in place)
      const Tensor<float, 3> query = random.normal_tensor<float, 3>({2, q_len, 48});
      const Tensor<float, 3> memory = random.normal_tensor<float, 3>({2, 9, 20});
      const Tensor<float, 3>& key = self ? query : memory;
      Tensor<float, 3> got({2, q_len, 48}), expected({2, q_len, 48});
      mha.forward_into_with(half, query, key, key, got.view(), ws, opts);
      rounded.forward_into(query, key, key, expected.view(), ws_rounded, opts);
      // Lq = 10: 20 query rows and 18 key rows, every weight widened once (then Eigen's GEMM); Lq = 1: 2 query rows,
      // W_q and W_out (and W_k, W_v for self-attention) read in place by the few-row kernel. Bitwise either way.
      for (Index n = 0; n < got.size(); ++n) ASSERT_EQ(got.data()[n], expected.data()[n]) << "Lq " << q_len << ", element " << n;
    }
    MhaParams<S> wrong = half;
    wrong.out_weight = Tensor<S, 2>({48, 47});
    const Tensor<float, 3> x = random.normal_tensor<float, 3>({1, 3, 48});
    Tensor<float, 3> y({1, 3, 48});
    y.fill(7.0f);
    const Tensor<float, 3> memory = random.normal_tensor<float, 3>({1, 4, 20});
    test::expect_error<ShapeError>([&] { mha.forward_into_with(wrong, x, self ? x : memory, self ? x : memory, y.view(), ws); },
                                   {"MultiHeadAttention::forward_into", "params().out_weight", "(48, 47)"});
    for (Index n = 0; n < y.size(); ++n) ASSERT_EQ(y.data()[n], 7.0f) << "nothing written on error";
  }
}

// A layer config for the 16-bit parameter tests: pre-norm with RMSNorm and SwiGLU, or post-norm with LayerNorm, GELU
// and biases; GQA and RoPE in both.
TransformerLayerConfig sixteen_bit_layer_config(bool pre_norm) {
  TransformerLayerConfig cfg = decoder_layer_config(48, 4, 40);
  cfg.attention.num_kv_heads = 2;
  cfg.attention.rope_dim = 12;
  if (pre_norm) {
    cfg.norm = NormKind::rms_norm;
    cfg.activation = Activation::swiglu;
    cfg.bias = false;
    cfg.attention.bias = false;
  } else {
    cfg.norm_first = false;
    cfg.activation = Activation::gelu;
  }
  return cfg;
}

// Norm weights and biases drawn at random (the layer starts them at 1 and 0, which every type holds exactly).
void randomize_norms(TransformerLayerParams<float>& p, Random& random) {
  for (Tensor<float, 1>* t : {&p.norm1_weight, &p.norm1_bias, &p.norm2_weight, &p.norm2_bias})
    for (Index n = 0; n < t->size(); ++n) t->data()[n] = 1.0f + 0.5f * static_cast<float>(random.normal());
}

// TransformerLayer::step_with and TransformerStack::step_with on 16-bit parameters against modules holding the same
// values in float, bitwise: a 20-row prompt (the weights widened once, float GEMMs) and decode steps (the weights
// read in place); pre- and post-norm, over 16-bit and float caches; a wrong shape names the parameter and leaves the
// cache.
TYPED_TEST(HalfPrecisionTest, LayerAndStackStepWithSixteenBitParameters) {
  using S = TypeParam;
  Random random(21);
  for (bool pre_norm : {true, false}) {
    SCOPED_TRACE(pre_norm ? "pre-norm" : "post-norm");
    TransformerStackConfig stack_cfg;
    stack_cfg.layer = sixteen_bit_layer_config(pre_norm);
    stack_cfg.num_layers = 2;
    stack_cfg.final_norm = pre_norm;
    TransformerStack<float> model(stack_cfg, 3);
    for (TransformerLayerParams<float>& layer : model.params().layers) randomize_norms(layer, random);
    for (Index n = 0; n < model.params().norm_weight.size(); ++n)
      model.params().norm_weight.data()[n] = 1.0f + 0.5f * static_cast<float>(random.normal());
    const TransformerStackParams<S> half = params_cast<S>(model.params());
    const TransformerStackParams<float> wide = params_cast<float>(half);
    ASSERT_EQ(half.layers.size(), 2u);
    EXPECT_EQ(half.norm_weight.size(), pre_norm ? 48 : 0);
    EXPECT_EQ(half.layers[1].linear1_weight.dim(0), pre_norm ? 80 : 40);  // SwiGLU: 2F

    // The expected outputs come from modules holding the rounded values as their own params(), run by step.
    TransformerStack<float> rounded(stack_cfg, 4);
    rounded.params() = wide;
    const TransformerLayer<float> layer(stack_cfg.layer, 5);
    TransformerLayer<float> rounded_layer(stack_cfg.layer, 6);
    rounded_layer.params() = wide.layers[0];
    auto layer_half = layer.make_cache<S>(2), layer_wide = layer.make_cache<S>(2);
    auto stack_half = model.make_cache<S>(2), stack_wide = model.make_cache<S>(2);
    auto stack_float_half = model.make_cache(2), stack_float_wide = model.make_cache(2);
    const Tensor<float, 3> prompt = random.normal_tensor<float, 3>({2, 10, 48});  // 20 rows: the widened route
    const auto expect_bitwise = [](const Tensor<float, 3>& got, const Tensor<float, 3>& expected) {
      ASSERT_EQ(got.shape(), expected.shape());
      for (Index n = 0; n < got.size(); ++n) ASSERT_EQ(got.data()[n], expected.data()[n]) << "element " << n;
    };
    expect_bitwise(layer.step_with(half.layers[0], prompt, layer_half), rounded_layer.step(prompt, layer_wide));
    expect_bitwise(model.step_with(half, prompt, stack_half), rounded.step(prompt, stack_wide));
    expect_bitwise(model.step_with(half, prompt, stack_float_half), rounded.step(prompt, stack_float_wide));
    for (int t = 0; t < 3; ++t) {  // 2 rows: the weights read in place
      SCOPED_TRACE("decode step " + std::to_string(t));
      const Tensor<float, 3> token = random.normal_tensor<float, 3>({2, 1, 48});
      expect_bitwise(layer.step_with(half.layers[0], token, layer_half), rounded_layer.step(token, layer_wide));
      expect_bitwise(model.step_with(half, token, stack_half), rounded.step(token, stack_wide));
      expect_bitwise(model.step_with(half, token, stack_float_half), rounded.step(token, stack_float_wide));
    }
    EXPECT_EQ(layer_half.lengths(), layer_wide.lengths());

    TransformerStackParams<S> wrong = half;
    wrong.layers[1].linear2_weight = Tensor<S, 2>({48, 39});
    const std::vector<Index> lengths = stack_half.layers[0].lengths();
    test::expect_error<ShapeError>([&] { model.step_with(wrong, random.normal_tensor<float, 3>({2, 1, 48}), stack_half); },
                                   {"TransformerLayer::step", "linear2_weight", "(48, 39)"});
    for (const auto& cache : stack_half.layers) EXPECT_EQ(cache.lengths(), lengths);
    wrong = half;
    wrong.layers.pop_back();
    test::expect_error<std::invalid_argument>(
        [&] { model.step_with(wrong, random.normal_tensor<float, 3>({2, 1, 48}), stack_half); },
        {"TransformerStack::step", "params().layers", "expected 2 layers, got 1"});
    TransformerLayerParams<S> wrong_norm = half.layers[0];
    wrong_norm.norm2_weight = Tensor<S, 1>(std::array<Index, 1>{47});
    test::expect_error<ShapeError>([&] { layer.step_with(wrong_norm, random.normal_tensor<float, 3>({2, 1, 48}), layer_half); },
                                   {"TransformerLayer::step", "norm2_weight", "(47)"});
    EXPECT_EQ(layer_half.lengths(), layer_wide.lengths());
  }
}

// The modules on 16-bit activations (a float module: x in bfloat16 or float16, the output in the same type) give
// bitwise the float entry's output on the widened input, rounded once: MultiHeadAttention step, step_into (with
// padded sequences), step_with and step_into_with on 16-bit parameters, forward_into and forward_into_with (self-
// and cross-attention), TransformerLayer and TransformerStack step and step_with; the float and 16-bit routes
// leave bitwise the same cache. A wrong output or one overlapping an input names the argument and writes nothing.
TYPED_TEST(HalfPrecisionTest, ModulesTakeAndReturnSixteenBitActivations) {
  using S = TypeParam;
  const auto expect_bitwise = [](const Tensor<S, 3>& got, const Tensor<S, 3>& expected) {
    ASSERT_EQ(got.shape(), expected.shape());
    for (Index n = 0; n < got.size(); ++n) ASSERT_EQ(bits_of(got.data()[n]), bits_of(expected.data()[n])) << "element " << n;
  };
  const auto expect_same_cache = [](const KVCache<float, S>& a, const KVCache<float, S>& b) {
    ASSERT_EQ(a.lengths(), b.lengths());
    for (Index seq = 0; seq < a.batch(); ++seq) {
      const Tensor<S, 4> ka(a.sequence_keys(seq)), kb(b.sequence_keys(seq));
      for (Index n = 0; n < ka.size(); ++n) ASSERT_EQ(bits_of(ka.data()[n]), bits_of(kb.data()[n])) << "key " << n;
    }
  };
  Random random(31);
  const auto activations = [&](std::array<Index, 3> shape) {
    return tensor_cast<S>(random.normal_tensor<float, 3>(shape));
  };
  MultiHeadAttentionConfig cfg = ModuleConfig(48, 4).kv_heads(2).rope(12);
  const MultiHeadAttention<float> mha(cfg, 7);
  const MhaParams<S> half = params_cast<S>(mha.params());

  {
    SCOPED_TRACE("MultiHeadAttention step");
    KVCache<float, S> c16 = mha.make_cache<S>(2), c32 = mha.make_cache<S>(2), into16 = mha.make_cache<S>(2);
    KVCache<float, S> w16 = mha.make_cache<S>(2), w32 = mha.make_cache<S>(2);
    const Tensor<S, 3> prompt = activations({2, 10, 48});  // 20 rows: the GEMM route
    const Tensor<S, 3> prompt_output = tensor_cast<S>(mha.step(tensor_cast<float>(prompt), c32));
    expect_bitwise(mha.step(prompt, c16), prompt_output);
    expect_bitwise(mha.step_with(half, prompt, w16), tensor_cast<S>(mha.step_with(half, tensor_cast<float>(prompt), w32)));
    Tensor<S, 3> y({2, 10, 48});
    mha.step_into(prompt, into16, y);
    expect_bitwise(y, prompt_output);
    expect_same_cache(c16, into16);
    for (int t = 0; t < 3; ++t) {
      SCOPED_TRACE("decode step " + std::to_string(t));
      const Tensor<S, 3> token = activations({2, 2, 48});
      const std::vector<Index> new_tokens{2, 1};  // sequence 1: one real row, one padding row (output 0)
      const Tensor<S, 3> expected = tensor_cast<S>(mha.step(tensor_cast<float>(token), c32, {}, new_tokens));
      expect_bitwise(mha.step(token, c16, {}, new_tokens), expected);
      EXPECT_EQ(static_cast<float>(expected(1, 1, 0)), 0.0f);
      Tensor<S, 3> out({2, 2, 48});
      mha.step_into(token, into16, out.view(), {}, new_tokens);
      expect_bitwise(out, expected);
      const Tensor<S, 3> with = mha.step_with(half, token, w16);
      expect_bitwise(with, tensor_cast<S>(mha.step_with(half, tensor_cast<float>(token), w32)));
    }
    expect_same_cache(c16, c32);
    KVCache<float, S> into_with = mha.make_cache<S>(2), step_with_cache = mha.make_cache<S>(2);
    const Tensor<S, 3> token = activations({2, 1, 48});
    Tensor<S, 3> out({2, 1, 48});
    mha.step_into_with(half, token, into_with, out.view());
    expect_bitwise(out, mha.step_with(half, token, step_with_cache));

    // Errors: nothing written, the cache unchanged.
    const std::vector<Index> lengths = into16.lengths();
    Tensor<S, 3> wrong({2, 2, 48});
    wrong.fill(S(7.0f));
    test::expect_error<ShapeError>([&] { mha.step_into(token, into16, wrong); },
                                   {"MultiHeadAttention::step_into", "output", "(2, 1, 48)"});
    Tensor<S, 3> x_and_output = activations({2, 1, 48});
    test::expect_error<std::invalid_argument>([&] { mha.step_into(x_and_output, into16, x_and_output); },
                                              {"output", "overlaps x_new"});
    test::expect_error<ShapeError>([&] { mha.step(activations({2, 1, 40}), into16); }, {"x_new", "(2, *, 48)"});
    EXPECT_EQ(into16.lengths(), lengths);
    for (Index n = 0; n < wrong.size(); ++n) ASSERT_EQ(static_cast<float>(wrong.data()[n]), 7.0f);
  }

  for (const bool self : {true, false}) {
    SCOPED_TRACE(self ? "forward_into, self-attention" : "forward_into, cross-attention");
    MultiHeadAttentionConfig cross = cfg;
    if (!self) cross.kdim = cross.vdim = 20;
    const MultiHeadAttention<float> module(cross, 9);
    const MhaParams<S> module_half = params_cast<S>(module.params());
    AttentionOptions<float> opts;
    opts.causal = Causal::bottom_right;
    MhaWorkspace<float> ws, ws32;
    for (const Index q_len : {Index(10), Index(1)}) {
      const Tensor<S, 3> query = activations({2, q_len, 48}), memory = activations({2, 9, 20});
      const Tensor<S, 3>& key = self ? query : memory;
      const Tensor<float, 3> query32 = tensor_cast<float>(query), key32 = tensor_cast<float>(key);
      const Tensor<float, 3>& query_or_key32 = self ? query32 : key32;
      Tensor<S, 3> got({2, q_len, 48});
      Tensor<float, 3> expected({2, q_len, 48});
      module.forward_into(query, key, key, got, ws, opts);
      module.forward_into(query32, query_or_key32, query_or_key32, expected, ws32, opts);
      expect_bitwise(got, tensor_cast<S>(expected));
      module.forward_into_with(module_half, query, key, key, got.view(), ws, opts);
      module.forward_into_with(module_half, query32, query_or_key32, query_or_key32, expected.view(), ws32, opts);
      expect_bitwise(got, tensor_cast<S>(expected));
    }
    const Tensor<S, 3> x = activations({1, 3, 48}), memory = activations({1, 4, 20});
    Tensor<S, 3> y({1, 3, 48});
    y.fill(S(7.0f));
    Tensor<S, 3> wrong({1, 4, 48});
    test::expect_error<ShapeError>([&] { module.forward_into(x, self ? x : memory, self ? x : memory, wrong, ws); },
                                   {"MultiHeadAttention::forward_into", "output", "(1, 3, 48)"});
    Tensor<S, 3> shared = x;
    test::expect_error<std::invalid_argument>(
        [&] { module.forward_into(shared, self ? shared : memory, self ? shared : memory, shared.view(), ws); },
        {"output", "overlaps query"});
    for (Index n = 0; n < y.size(); ++n) ASSERT_EQ(static_cast<float>(y.data()[n]), 7.0f);
  }

  for (bool pre_norm : {true, false}) {
    SCOPED_TRACE(pre_norm ? "layer and stack, pre-norm" : "layer and stack, post-norm");
    TransformerStackConfig stack_cfg;
    stack_cfg.layer = sixteen_bit_layer_config(pre_norm);
    stack_cfg.num_layers = 2;
    stack_cfg.final_norm = pre_norm;
    const TransformerStack<float> model(stack_cfg, 3);
    const TransformerStackParams<S> model_half = params_cast<S>(model.params());
    const TransformerLayer<float> layer(stack_cfg.layer, 5);
    auto s16 = model.make_cache<S>(2), s32 = model.make_cache<S>(2), h16 = model.make_cache<S>(2),
         h32 = model.make_cache<S>(2);
    auto l16 = layer.make_cache<S>(2), l32 = layer.make_cache<S>(2);
    for (const Index rows : {Index(10), Index(1), Index(1)}) {
      const Tensor<S, 3> x = activations({2, rows, 48});
      const Tensor<float, 3> x32 = tensor_cast<float>(x);
      expect_bitwise(model.step(x, s16), tensor_cast<S>(model.step(x32, s32)));
      expect_bitwise(model.step_with(model_half, x, h16), tensor_cast<S>(model.step_with(model_half, x32, h32)));
      expect_bitwise(layer.step(x, l16), tensor_cast<S>(layer.step(x32, l32)));
    }
    expect_same_cache(l16, l32);
    const std::vector<Index> lengths = s16.layers[0].lengths();
    test::expect_error<ShapeError>([&] { model.step(activations({2, 1, 40}), s16); }, {"TransformerStack::step", "x_new"});
    for (const auto& cache : s16.layers) EXPECT_EQ(cache.lengths(), lengths);
  }
}

#if SELFATTN_BF16_DOT
// The products' own pieces, called from functions compiled for the avx512_bf16 level as the products are (the tests
// below run them only on a CPU that has it).
SELFATTN_TARGET_BEGIN(SELFATTN_ISA_FEATURES_AVX512_BF16)
namespace bf16_level {
namespace micro = detail::isa_avx512_bf16::micro;

/// round_to_pairs on values[0, 32): 16 pairs.
void round_to_pairs(const float* values, std::uint32_t* pairs) {
  _mm512_storeu_si512(pairs, micro::round_to_pairs(_mm512_loadu_ps(values), _mm512_loadu_ps(values + 16)));
}

/// c (rows x 64, row-major) = bf16_gemm_panel<4> of a (rows x depth pairs) and b (depth x 64 pairs).
void gemm_panel(Index rows, Index depth, const std::uint32_t* a, const std::uint32_t* b, float* c) {
  constexpr Index lanes = 4 * 16;
  const auto store = [&](Index m0, auto& acc) {
    constexpr int R = static_cast<int>(std::extent_v<std::remove_reference_t<decltype(acc)>>);
    for (int r = 0; r < R; ++r)
      for (int v = 0; v < 4; ++v) _mm512_storeu_ps(c + (m0 + r) * lanes + v * 16, acc[r][v]);
  };
  micro::bf16_gemm_panel<4>(rows, depth, a, depth, b, lanes, store);
}
}  // namespace bf16_level
SELFATTN_TARGET_END

#define SKIP_WITHOUT_AVX512_BF16() \
  if (!cpu_info().avx512_bf16) GTEST_SKIP() << "this CPU has no AVX-512 BF16 instructions"

// round_to_pairs: two packets of float rounded to bfloat16 (to nearest, ties to even, as Eigen's conversion; a
// subnormal to a zero of its sign, as the instruction does) and interleaved first/second, on random floats, exact
// ties, values that round up across an exponent, and subnormals.
TEST(Bf16DotProducts, PairsRoundToNearestEvenAndInterleave) {
  SKIP_WITHOUT_AVX512_BF16();
  const auto rounded_bits = [](float x) -> std::uint32_t {
    if (std::fpclassify(x) == FP_SUBNORMAL) return std::signbit(x) ? 0x8000u : 0u;
    return bits_of(bfloat16(x));
  };
  Random random(8);
  std::vector<float> values;
  for (int i = 0; i < 4096; ++i) values.push_back(static_cast<float>(random.normal()) * 100.0f);
  for (std::uint32_t upper : {0x3F80u, 0x3F81u, 0x4000u, 0xBF7Fu, 0x7F7Fu, 0x0001u, 0x8001u})
    for (std::uint32_t lower : {0x8000u, 0x7FFFu, 0x8001u, 0xFFFFu, 0x0000u})
      values.push_back(float_from_bits(upper << 16 | lower));
  while (values.size() % 32 != 0) values.push_back(0.0f);
  for (std::size_t i = 0; i < values.size(); i += 32) {
    std::uint32_t pairs[16];
    bf16_level::round_to_pairs(&values[i], pairs);
    for (std::size_t l = 0; l < 16; ++l) {
      ASSERT_EQ(pairs[l] & 0xFFFFu, rounded_bits(values[i + l])) << values[i + l];
      ASSERT_EQ(pairs[l] >> 16, rounded_bits(values[i + 16 + l])) << values[i + 16 + l];
    }
  }
}

// bf16_gemm_panel against exact sums in double: every row block size (full blocks and each tail), depths of 0, 1
// and many pairs; products of bfloat16 are exact in float, so the only error is float summation's.
TEST(Bf16DotProducts, PanelSumsExactProductsOverEveryRowBlock) {
  SKIP_WITHOUT_AVX512_BF16();
  constexpr Index lanes = 4 * 16;
  Random random(13);
  for (Index rows : {1, 2, 5, 6, 7, 13})
    for (Index depth : {0, 1, 3, 32, 65}) {
      std::vector<bfloat16> a(static_cast<std::size_t>(rows * 2 * depth)), b(static_cast<std::size_t>(2 * depth * lanes));
      for (bfloat16& x : a) x = bfloat16(static_cast<float>(random.normal()));
      for (bfloat16& x : b) x = bfloat16(static_cast<float>(random.normal()));
      // a: rows x depth pairs, row-major; b: depth x lanes pairs (pair p of lane i: depth indices 2p, 2p + 1).
      std::vector<std::uint32_t> a_pairs(static_cast<std::size_t>(rows * depth)), b_pairs(static_cast<std::size_t>(depth * lanes));
      for (Index m = 0; m < rows; ++m)
        for (Index p = 0; p < depth; ++p)
          a_pairs[static_cast<std::size_t>(m * depth + p)] = detail::micro::load_pair(&a[static_cast<std::size_t>(m * 2 * depth + 2 * p)], 2);
      for (Index p = 0; p < depth; ++p)
        for (Index i = 0; i < lanes; ++i)
          b_pairs[static_cast<std::size_t>(p * lanes + i)] = detail::micro::make_pair(
              b[static_cast<std::size_t>((2 * p) * lanes + i)], b[static_cast<std::size_t>((2 * p + 1) * lanes + i)]);
      std::vector<float> c(static_cast<std::size_t>(rows * lanes), std::numeric_limits<float>::quiet_NaN());
      bf16_level::gemm_panel(rows, depth, a_pairs.data(), b_pairs.data(), c.data());
      for (Index m = 0; m < rows; ++m)
        for (Index i = 0; i < lanes; ++i) {
          double exact = 0.0, magnitude = 0.0;
          for (Index k = 0; k < 2 * depth; ++k) {
            const double term = static_cast<double>(static_cast<float>(a[static_cast<std::size_t>(m * 2 * depth + k)])) *
                                static_cast<double>(static_cast<float>(b[static_cast<std::size_t>(k * lanes + i)]));
            exact += term;
            magnitude += std::abs(term);
          }
          const double got = c[static_cast<std::size_t>(m * lanes + i)];
          ASSERT_LE(std::abs(got - exact), 2.0 * static_cast<double>(depth) * std::numeric_limits<float>::epsilon() * magnitude)
              << "rows " << rows << " depth " << depth << " row " << m << " lane " << i;
        }
    }
}
#endif

// Backward: dq, dk, dv in the inputs' type within twice the baseline's error (a float reference backward from the
// same 16-bit inputs), dbias in float within float tolerance. All three backwards (ours, the baseline and the
// float64 truth) take the 16-bit forward's out and lse: the test is of the backward's own error (the forward's,
// BF16 dot products included, is the forward tests'; o enters dS through rowsum(dO * o), where a cancellation would
// otherwise charge the forward's rounding to the backward).
TYPED_TEST(HalfPrecisionTest, BackwardFollowsTheFlashAttentionRule) {
  using S = TypeParam;
  Random random(99);
  for (const test::Shape& shape : test::sweep_shapes)
    for (MaskKind kind : {MaskKind::none, MaskKind::causal_top_left, MaskKind::key_lengths, MaskKind::bias_full,
                          MaskKind::alibi, MaskKind::everything}) {
      const HalfCall<S> call(shape, kind, random);
      const AttentionOptions<float>& opts = call.masks.opts;
      const AttentionForward<S> forward = sdpa_forward(call.q, call.k, call.v, opts);
      const AttentionGradients<S> ours = sdpa_backward(call.q, call.k, call.v, forward.out, forward.lse, call.dout, opts);

      const Tensor<double, 4> q64 = tensor_cast<double>(call.q), k64 = tensor_cast<double>(call.k);
      const Tensor<double, 4> v64 = tensor_cast<double>(call.v), dout64 = tensor_cast<double>(call.dout);
      const auto truth = sdpa_backward(q64, k64, v64, tensor_cast<double>(forward.out),
                                       tensor_cast<double>(forward.lse), dout64, call.opts64);

      AttentionOptions<float> reference32 = opts;
      reference32.kernel = Kernel::reference;
      const Tensor<float, 4> q32 = tensor_cast<float>(call.q), k32 = tensor_cast<float>(call.k);
      const Tensor<float, 4> v32 = tensor_cast<float>(call.v), dout32 = tensor_cast<float>(call.dout);
      const auto baseline =
          sdpa_backward(q32, k32, v32, tensor_cast<float>(forward.out), forward.lse, dout32, reference32);

      const std::string where = "shape " + detail::shape_string<4>(call.q.shape()) + " k " +
                                detail::shape_string<4>(call.k.shape()) + " mask kind " +
                                std::to_string(static_cast<int>(kind));
      EXPECT_TRUE(within_twice_baseline(ours.dq, tensor_cast<S>(baseline.dq), truth.dq)) << where << " dq";
      EXPECT_TRUE(within_twice_baseline(ours.dk, tensor_cast<S>(baseline.dk), truth.dk)) << where << " dk";
      EXPECT_TRUE(within_twice_baseline(ours.dv, tensor_cast<S>(baseline.dv), truth.dv)) << where << " dv";
      if (opts.bias.data()) {
        EXPECT_TRUE(test::all_close(ours.dbias, tensor_cast<float>(truth.dbias), test::default_tolerance<float>()))
            << where << " dbias";
      }
    }
}

// A 16-bit KV cache holds exactly the float cache's rows rounded once (also after evicting with re-rotated sinks),
// in half the bytes, and the module's steps over it stay within 16-bit rounding of the float cache's.
TYPED_TEST(HalfPrecisionTest, CacheStoresRoundedRowsInHalfTheMemory) {
  using S = TypeParam;
  for (const CachePolicy& policy : {CachePolicy::keep_all(), CachePolicy::attention_sinks(2, 5)}) {
    const MultiHeadAttention<float> mha(ModuleConfig(32, 4).kv_heads(2).rope(8), 5);
    KVCache<float> wide = mha.make_cache(2, policy);
    KVCache<float, S> half = mha.make_cache<S>(2, policy);
    Random random(3);
    const Tensor<float, 3> prompt = random.normal_tensor<float, 3>({2, 4, 32});
    Tensor<float, 3> y_wide = mha.step(prompt, wide), y_half = mha.step(prompt, half);
    for (int t = 0; t < 6; ++t) {
      const Tensor<float, 3> token = random.normal_tensor<float, 3>({2, 1, 32});
      y_wide = mha.step(token, wide);
      Tensor<float, 3> out({2, 1, 32});
      mha.step_into(token, half, out.view());
      y_half = out;
      EXPECT_TRUE(test::all_close(y_half, y_wide, 3.0 * std::ldexp(1.0, std::is_same_v<S, bfloat16> ? -8 : -11)))
          << "step " << t;
    }
    ASSERT_EQ(half.lengths(), wide.lengths());
    for (Index b = 0; b < 2; ++b) {
      const Tensor<S, 4> keys = tensor_cast<S>(wide.sequence_keys(b)), values = tensor_cast<S>(wide.sequence_values(b));
      const Tensor<S, 4> stored_keys(half.sequence_keys(b)), stored_values(half.sequence_values(b));
      for (Index n = 0; n < keys.size(); ++n) {
        ASSERT_EQ(bits_of(stored_keys.data()[n]), bits_of(keys.data()[n])) << "key element " << n;
        ASSERT_EQ(bits_of(stored_values.data()[n]), bits_of(values.data()[n])) << "value element " << n;
      }
    }
    EXPECT_EQ(wide.capacity(), half.capacity());
    const std::size_t sinks = sizeof(float) * static_cast<std::size_t>(2 * 2 * policy.sink_tokens * 8);
    EXPECT_EQ(2 * (half.memory_bytes() - sinks), wide.memory_bytes() - sinks);
  }
}

// A stack of layers decodes over 16-bit caches (one per layer): within 16-bit rounding of the float caches'
// outputs, every layer's cache in half the bytes, and argument errors leave every cache as it was.
TYPED_TEST(HalfPrecisionTest, StackDecodesOverSixteenBitCaches) {
  using S = TypeParam;
  TransformerStackConfig cfg;
  cfg.layer.attention.embed_dim = 16;
  cfg.layer.attention.num_heads = 4;
  cfg.layer.attention.num_kv_heads = 2;
  cfg.layer.attention.rope_dim = 4;
  cfg.layer.ffn_dim = 32;
  cfg.layer.norm_first = true;
  cfg.layer.causal = true;
  cfg.num_layers = 3;
  cfg.final_norm = true;
  const TransformerStack<float> stack(cfg, 8);
  TransformerStackCache<float> wide = stack.make_cache(1);
  TransformerStackCache<float, S> half = stack.make_cache<S>(1);
  Random random(12);
  const double tolerance = 8.0 * std::ldexp(1.0, std::is_same_v<S, bfloat16> ? -8 : -11);
  const Tensor<float, 3> prompt = random.normal_tensor<float, 3>({1, 5, 16});
  EXPECT_TRUE(test::all_close(stack.step(prompt, half), stack.step(prompt, wide), tolerance));
  for (int t = 0; t < 4; ++t) {
    const Tensor<float, 3> token = random.normal_tensor<float, 3>({1, 1, 16});
    EXPECT_TRUE(test::all_close(stack.step(token, half), stack.step(token, wide), tolerance)) << "step " << t;
  }
  EXPECT_EQ(half.length(), 9);
  EXPECT_EQ(2 * half.memory_bytes(), wide.memory_bytes());
  test::expect_error<ShapeError>([&] { stack.step(Tensor<float, 3>({1, 1, 8}), half); }, {"x_new"});
  EXPECT_EQ(half.length(), 9);
}

// Bad 16-bit calls throw naming the argument, before anything is written.
TYPED_TEST(HalfPrecisionTest, ErrorsNameTheArgument) {
  using S = TypeParam;
  const Tensor<S, 4> q({1, 4, 3, 8}), k({1, 3, 5, 8}), v({1, 2, 5, 8}), k_good({1, 2, 5, 8});
  test::expect_error<ShapeError>([&] { sdpa_forward(q, k, v); }, {"sdpa_forward", "k", "divide"});
  test::expect_error<ShapeError>([&] { sdpa_forward(q, k_good, tensor_cast<S>(Tensor<float, 4>({1, 2, 4, 8}))); },
                                 {"sdpa_forward", "v"});
  Tensor<S, 4> out({1, 4, 3, 8});
  out.fill(S(7.0f));
  Tensor<float, 3> lse({1, 4, 2});
  test::expect_error<ShapeError>([&] { sdpa_forward_into(q, k_good, v, out.view(), lse.view()); },
                                 {"sdpa_forward_into", "lse"});
  for (Index n = 0; n < out.size(); ++n) ASSERT_EQ(static_cast<float>(out.data()[n]), 7.0f);
  AttentionOptions<float> opts;
  opts.key_lengths = {9};
  test::expect_error<std::invalid_argument>([&] { sdpa_forward(q, k_good, v, opts); }, {"opts.key_lengths[0]"});
  const MultiHeadAttention<float> mha(ModuleConfig(16, 2));
  KVCache<float, S> cache = mha.make_cache<S>(1);
  test::expect_error<ShapeError>([&] { mha.step(Tensor<float, 3>({1, 1, 8}), cache); }, {"x_new"});
  EXPECT_EQ(cache.length(), 0);
}

}  // namespace
}  // namespace selfattn::test
