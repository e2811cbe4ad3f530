// tests/fuzz/attention_case.hpp — one fuzz case of the attention API, run_case<T>, for float and double.
//
// The bytes choose a whole call: dtype, shapes (sometimes inconsistent on purpose), memory layouts (contiguous,
// heads-interleaved like split_heads, padded rows), every option and mask (sometimes invalid on purpose). Then:
//   - the reference kernel and the default (fused) kernel either both throw std::invalid_argument, or
//   - both return, the output is finite, and the two agree (forward out and lse, backward dq, dk, dv, dbias);
//   - and the reference agrees with the brute force of tests/support/brute_force.hpp (plain loops from the
//     semantics, none of the library's mask or kernel code), so a bug in code the kernels share (the mask rule,
//     the head mapping) is a finding too: lse and weights always, out and the gradients without dropout. It runs
//     on the smaller cases only (brute_force_work): it costs as much as both kernels many times over.
// Anything else (another exception, a NaN, a disagreement, a sanitizer report) aborts: a finding.
//
// run_case<double> is compiled in attention_fuzz_double.cpp, run_case<float> in attention_fuzz.cpp: two files that
// build in parallel. Under the fuzzer's flags (-O1, coverage, ASan, UBSan) the one file took 225 s of one core.
#pragma once

#include "fuzz_input.hpp"
#include "../support/brute_force.hpp"

#include <selfattn/attention.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace selfattn::fuzz::attention {

[[noreturn]] inline void finding(const std::string& what) {
  std::fprintf(stderr, "attention_fuzz: %s\n", what.c_str());
  std::abort();
}

/// A (B, H, L, D) operand in one of three memory layouts, owning its storage.
template <typename T>
struct Operand {
  std::vector<T> storage;
  TensorView<const T, 4> view;
};

template <typename T>
Operand<T> make_operand(FuzzInput& in, std::mt19937_64& rng, const std::array<Index, 4>& shape) {
  const Index b = shape[0], h = shape[1], l = shape[2], d = shape[3];
  const int layout = static_cast<int>(in.range(0, 2));
  const Index row = d + (layout == 2 ? in.range(1, 3) : 0);  // padded rows: stride > D
  Operand<T> op;
  op.storage.resize(static_cast<std::size_t>(std::max<Index>(1, b * h * l * row)));
  std::uniform_real_distribution<double> value(-3.0, 3.0);
  for (T& x : op.storage) x = static_cast<T>(value(rng));
  // layout 1 stores (B, L, H, D), as split_heads sees a projection's output
  const std::array<Index, 4> strides =
      layout == 1 ? std::array<Index, 4>{l * h * row, row, h * row, 1} : std::array<Index, 4>{h * l * row, l * row, row, 1};
  op.view = TensorView<const T, 4>(op.storage.data(), shape, strides);
  return op;
}

/// A shape broadcastable to `full`: each extent either the full one or 1.
inline std::array<Index, 4> broadcast_shape(FuzzInput& in, const std::array<Index, 4>& full) {
  std::array<Index, 4> shape = full;
  for (Index& extent : shape)
    if (in.flag()) extent = 1;
  return shape;
}

template <typename T>
double tolerance() {
  return std::is_same_v<T, float> ? 2e-3 : 1e-10;
}

/// |a - e| <= tolerance * max(1, max |e|), with infinities equal only to themselves; NaN is always a finding.
/// `names` says what is compared: "fused vs reference", "reference vs brute force".
template <typename T, int Rank>
void expect_close(const char* what, const Tensor<T, Rank>& actual, const Tensor<T, Rank>& expected,
                  const char* names = "fused vs reference") {
  if (actual.shape() != expected.shape()) finding(std::string(what) + ": shapes differ (" + names + ")");
  double scale = 1.0;
  for (Index n = 0; n < expected.size(); ++n)
    if (std::isfinite(expected.data()[n])) scale = std::max(scale, std::abs(static_cast<double>(expected.data()[n])));
  for (Index n = 0; n < actual.size(); ++n) {
    const double a = actual.data()[n], e = expected.data()[n];
    if (std::isnan(a) || std::isnan(e)) finding(std::string(what) + ": NaN at flat index " + std::to_string(n));
    const bool same = (std::isinf(a) || std::isinf(e)) ? a == e : std::abs(a - e) <= tolerance<T>() * scale;
    if (!same)
      finding(std::string(what) + ": " + names + ": " + std::to_string(a) + " vs " + std::to_string(e) +
              " at flat index " + std::to_string(n));
  }
}

/// The brute force's multiply-adds, B H Lq Lk (D + Dv), up to which a case is compared with it. Uncapped, it made
/// the fuzzer several times slower (its first pass over the 1,421 corpus inputs took 215 s under ASan on this busy
/// machine); at 2^16 it checks three quarters of the corpus for a sixteenth of the work. The mask rules and the
/// head mapping show on small shapes as on large ones.
constexpr long brute_force_work = 1L << 16;

template <typename T, int Rank>
void expect_finite(const char* what, const Tensor<T, Rank>& t) {
  for (Index n = 0; n < t.size(); ++n)
    if (!std::isfinite(t.data()[n])) finding(std::string(what) + ": non-finite value at flat index " + std::to_string(n));
}

template <typename T>
void run_case(FuzzInput& in) {
  std::mt19937_64 rng(in.word());
  const Index batch = in.range(0, 2), kv_heads = in.range(1, 3), group = in.range(1, 3);
  const Index heads = kv_heads * group;
  const Index q_len = in.range(0, 40), k_len = in.range(0, 140);
  const Index dim = in.range(1, 24), v_dim = in.flag() ? dim : in.range(1, 24);

  // One deliberate inconsistency, a quarter of the time; the API must then throw std::invalid_argument.
  std::array<Index, 4> q_shape{batch, heads, q_len, dim}, k_shape{batch, kv_heads, k_len, dim},
      v_shape{batch, kv_heads, k_len, v_dim};
  const int corrupt = static_cast<int>(in.range(0, 39));
  bool invalid = corrupt >= 1 && corrupt <= 5;  // the cases below that always apply
  switch (corrupt) {
    case 1: k_shape[3] = dim + 1; break;                    // k's D differs from q's
    case 2: v_shape[2] = k_len + 1; break;                  // v's Lk differs from k's
    case 3: k_shape[1] = heads + 1; v_shape[1] = heads + 1; break;  // H not a multiple of Hkv
    case 4: v_shape[0] = batch + 1; break;                  // batch mismatch
    case 5: q_shape[3] = 0; k_shape[3] = 0; break;          // D = 0
    default: break;
  }
  const auto q = make_operand<T>(in, rng, q_shape);
  const auto k = make_operand<T>(in, rng, k_shape);
  const auto v = make_operand<T>(in, rng, v_shape);
  const std::array<Index, 4> scores{batch, heads, q_len, k_len};

  AttentionOptions<T> opts;
  opts.causal = static_cast<Causal>(in.range(0, 2));
  if (in.flag()) {
    for (Index b = 0; b < batch; ++b) opts.key_lengths.push_back(in.range(0, k_len));
    if (corrupt == 6) { opts.key_lengths.push_back(0); invalid = true; }  // one entry too many
    if (corrupt == 7 && batch > 0) { opts.key_lengths[0] = k_len + 1; invalid = true; }  // out of range
  }
  std::unique_ptr<bool[]> allowed_storage;
  if (in.flag()) {
    auto shape = broadcast_shape(in, scores);
    if (corrupt == 8) { shape[2] = q_len + 2; invalid = true; }  // neither Lq nor 1
    const std::size_t n = static_cast<std::size_t>(std::max<Index>(1, shape[0] * shape[1] * shape[2] * shape[3]));
    allowed_storage.reset(new bool[n]);
    const int density = static_cast<int>(in.range(0, 8));  // of 8: how many keys are allowed
    for (std::size_t i = 0; i < n; ++i) allowed_storage[i] = static_cast<int>(rng() % 8) < density;
    opts.allowed = TensorView<const bool, 4>(allowed_storage.get(), shape);
  }
  std::vector<T> bias_storage;
  if (in.flag()) {
    auto shape = broadcast_shape(in, scores);
    if (corrupt == 9) { shape[1] = heads + 1; invalid = true; }  // neither H nor 1
    bias_storage.resize(static_cast<std::size_t>(std::max<Index>(1, shape[0] * shape[1] * shape[2] * shape[3])));
    const int minus_inf = static_cast<int>(in.range(0, 4));  // of 8: entries that are -inf
    std::uniform_real_distribution<double> value(-6.0, 6.0);
    for (T& x : bias_storage)
      x = static_cast<int>(rng() % 8) < minus_inf ? -std::numeric_limits<T>::infinity() : static_cast<T>(value(rng));
    opts.bias = TensorView<const T, 4>(bias_storage.data(), shape);
  }
  if (in.flag()) opts.window_left = in.range(-1, 20);
  if (in.flag()) opts.window_right = in.range(-1, 20);
  if (corrupt == 10) { opts.window_left = -2; invalid = true; }
  if (in.flag()) {
    for (Index h = 0; h < heads; ++h) opts.alibi_slopes.push_back(static_cast<T>(in.range(0, 16)) / T(8));
    if (corrupt == 11) { opts.alibi_slopes.push_back(T(1)); invalid = true; }  // H + 1 slopes
    if (corrupt == 12) { opts.alibi_slopes.back() = std::numeric_limits<T>::infinity(); invalid = true; }
  }
  if (in.flag()) opts.scale = static_cast<T>(in.range(1, 64)) / T(16);
  if (corrupt == 13) { opts.scale = std::numeric_limits<T>::quiet_NaN(); invalid = true; }
  if (in.flag()) opts.dropout_p = static_cast<T>(in.range(0, 9)) / T(10);
  if (corrupt == 14) { opts.dropout_p = T(1); invalid = true; }
  opts.seed = in.word();
  opts.need_weights = in.flag();

  if (std::getenv("SELFATTN_FUZZ_VERBOSE"))  // triage: what this input decodes to
    std::fprintf(stderr,
                 "%s B=%ld H=%ld Hkv=%ld Lq=%ld Lk=%ld D=%ld Dv=%ld corrupt=%d causal=%d key_lengths=%zu allowed=%d "
                 "bias=%d window=(%ld,%ld) alibi=%zu scale=%g dropout=%g need_weights=%d\n",
                 std::is_same_v<T, float> ? "float" : "double", static_cast<long>(batch), static_cast<long>(heads),
                 static_cast<long>(kv_heads), static_cast<long>(q_len), static_cast<long>(k_len), static_cast<long>(dim),
                 static_cast<long>(v_dim), corrupt, static_cast<int>(opts.causal), opts.key_lengths.size(),
                 opts.allowed.data() != nullptr, opts.bias.data() != nullptr, static_cast<long>(opts.window_left),
                 static_cast<long>(opts.window_right), opts.alibi_slopes.size(),
                 opts.scale ? static_cast<double>(*opts.scale) : -1.0, static_cast<double>(opts.dropout_p),
                 opts.need_weights);

  // --- forward: reference vs default kernel ---
  AttentionOptions<T> reference_opts = opts;
  reference_opts.kernel = Kernel::reference;
  AttentionForward<T> expected, actual;
  bool reference_threw = false, fused_threw = false;
  try {
    expected = sdpa_forward(q.view, k.view, v.view, reference_opts);
  } catch (const std::invalid_argument&) {
    reference_threw = true;
  }
  try {
    actual = sdpa_forward(q.view, k.view, v.view, opts);
  } catch (const std::invalid_argument&) {
    fused_threw = true;
  }
  if (reference_threw != fused_threw) finding("only one kernel rejected the call");
  if (reference_threw != invalid)
    finding(invalid ? "an invalid call (case " + std::to_string(corrupt) + ") was accepted" : "a valid call was rejected");
  if (invalid) return;
  expect_finite("forward out", actual.out);
  expect_close("forward out", actual.out, expected.out);
  expect_close("forward lse", actual.lse, expected.lse);
  if (opts.need_weights) expect_finite("forward weights", actual.weights);
  // The brute force has no dropout; lse and weights are before dropout, so they compare whatever the rate.
  const bool brute_force = batch * heads * q_len * k_len * (dim + v_dim) <= brute_force_work;
  const bool no_dropout = opts.dropout_p == T(0);
  if (brute_force) {
    const auto brute = test::brute_force_attention<T>(q.view, k.view, v.view, opts);
    if (no_dropout) expect_close("forward out", expected.out, brute.out, "reference vs brute force");
    expect_close("forward lse", expected.lse, brute.lse, "reference vs brute force");
    if (opts.need_weights) expect_close("forward weights", expected.weights, brute.weights, "reference vs brute force");
  }

  // --- backward: reference vs default kernel, on the reference forward's out and lse ---
  const auto dout = make_operand<T>(in, rng, {batch, heads, q_len, v_dim});
  const auto g_expected = sdpa_backward(q.view, k.view, v.view, expected.out, expected.lse, dout.view, reference_opts);
  const auto g_actual = sdpa_backward(q.view, k.view, v.view, expected.out, expected.lse, dout.view, opts);
  expect_close("backward dq", g_actual.dq, g_expected.dq);
  expect_close("backward dk", g_actual.dk, g_expected.dk);
  expect_close("backward dv", g_actual.dv, g_expected.dv);
  expect_close("backward dbias", g_actual.dbias, g_expected.dbias);
  expect_finite("backward dq", g_actual.dq);
  expect_finite("backward dk", g_actual.dk);
  expect_finite("backward dv", g_actual.dv);
  expect_finite("backward dbias", g_actual.dbias);
  if (!brute_force || !no_dropout) return;
  const auto g_brute = test::brute_force_backward<T>(q.view, k.view, v.view, dout.view, opts);
  expect_close("backward dq", g_expected.dq, g_brute.dq, "reference vs brute force");
  expect_close("backward dk", g_expected.dk, g_brute.dk, "reference vs brute force");
  expect_close("backward dv", g_expected.dv, g_brute.dv, "reference vs brute force");
  expect_close("backward dbias", g_expected.dbias, g_brute.dbias, "reference vs brute force");
}

}  // namespace selfattn::fuzz::attention
