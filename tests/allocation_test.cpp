// Tests of the calls that do not allocate (issue 15, item 3): sdpa_forward_into and sdpa_backward_into with an
// AttentionWorkspace, MultiHeadAttention::step_into (buffers in the cache) and forward_into (an MhaWorkspace).
// After a warm-up call, further calls of the same shape make exactly 0 calls of operator new and 0 of malloc (Eigen's
// heap allocations), and write bitwise what the allocating forms return; destinations that overlap an input or
// have the wrong shape are refused naming the argument, before anything is written. And the fused forward's scratch
// memory is O(tile): its peak bytes hold no (Lq, Lk) matrix.
//
// Counting: a replaced global operator new counts its calls and the bytes live and at their peak (every std::vector,
// std::string, shared_ptr... goes through it). Eigen allocates with std::malloc, not operator new: the program is
// linked with -Wl,--wrap=malloc (and calloc, realloc; tests/CMakeLists.txt), so that every call of malloc in its own
// objects, the shared kernels of tests/support's instances among them, reaches __wrap_malloc below, which counts it
// and calls the C library's. (Before, this file defined EIGEN_RUNTIME_NO_MALLOC and compiled every kernel itself, with
// that macro: the longest compile of the sanitize stage, 175 CPU s under ASan.) Allocations inside shared libraries
// (the C++ runtime, OpenMP's) are not ours and are not seen.
// Under ThreadSanitizer, whose runtime defines operator new itself, nothing is counted: the tests skip.
#include <atomic>
#include <cstddef>

#include <selfattn/attention.hpp>
#include <selfattn/detail/dispatch.hpp>
#include <selfattn/half_precision.hpp>
#include <selfattn/nn/kv_cache.hpp>
#include <selfattn/nn/module_workspace.hpp>
#include <selfattn/nn/multihead.hpp>
#include <selfattn/workspace.hpp>

#include "support/expect_error.hpp"
#include "support/module_config.hpp"
#include "support/random.hpp"
#include "support/sanitizers.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <new>
#include <string>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#if defined(__SANITIZE_THREAD__)
#define SELFATTN_TEST_UNDER_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define SELFATTN_TEST_UNDER_TSAN 1
#endif
#endif

namespace {
std::atomic<bool> counting{false};
std::atomic<long long> new_calls{0};
std::atomic<long long> malloc_calls{0};  // malloc, calloc and realloc while counting: Eigen's heap allocations
std::atomic<long long> live_bytes{0};  // bytes allocated and not yet freed while counting
std::atomic<long long> peak_bytes{0};  // their maximum
}  // namespace

// The link's --wrap: a call of malloc in this program's objects calls __wrap_malloc; __real_malloc is the C library's.
extern "C" {
void* __real_malloc(std::size_t size);
void* __real_calloc(std::size_t count, std::size_t size);
void* __real_realloc(void* pointer, std::size_t size);

void* __wrap_malloc(std::size_t size) {
  if (counting.load()) ++malloc_calls;
  return __real_malloc(size);
}
void* __wrap_calloc(std::size_t count, std::size_t size) {
  if (counting.load()) ++malloc_calls;
  return __real_calloc(count, size);
}
void* __wrap_realloc(void* pointer, std::size_t size) {
  if (counting.load()) ++malloc_calls;
  return __real_realloc(pointer, size);
}
}

#ifndef SELFATTN_TEST_UNDER_TSAN
namespace {
// Each block carries its size and alignment in front of it, so that operator delete can count the bytes it frees.
constexpr std::size_t header = 64;  // room for both; keeps every alignment <= 64

void* counted_new(std::size_t size, std::size_t alignment) {
  alignment = std::max(alignment, header);
  const std::size_t total = (size + alignment + alignment - 1) / alignment * alignment;
  auto* base = static_cast<unsigned char*>(std::aligned_alloc(alignment, total));
  if (!base) throw std::bad_alloc();
  unsigned char* user = base + alignment;
  reinterpret_cast<std::size_t*>(user - sizeof(std::size_t))[0] = size;
  reinterpret_cast<std::size_t*>(user - 2 * sizeof(std::size_t))[0] = alignment;
  if (counting.load()) {
    ++new_calls;
    const long long now = live_bytes += static_cast<long long>(size);
    long long peak = peak_bytes.load();
    while (now > peak && !peak_bytes.compare_exchange_weak(peak, now)) {
    }
  }
  return user;
}

void counted_delete(void* pointer) noexcept {
  if (!pointer) return;
  auto* user = static_cast<unsigned char*>(pointer);
  const std::size_t size = reinterpret_cast<std::size_t*>(user - sizeof(std::size_t))[0];
  const std::size_t alignment = reinterpret_cast<std::size_t*>(user - 2 * sizeof(std::size_t))[0];
  if (counting.load()) live_bytes -= static_cast<long long>(size);
  std::free(user - alignment);
}
}  // namespace

void* operator new(std::size_t size) { return counted_new(size, alignof(std::max_align_t)); }
void* operator new[](std::size_t size) { return counted_new(size, alignof(std::max_align_t)); }
void* operator new(std::size_t size, std::align_val_t alignment) {
  return counted_new(size, static_cast<std::size_t>(alignment));
}
void* operator new[](std::size_t size, std::align_val_t alignment) {
  return counted_new(size, static_cast<std::size_t>(alignment));
}
void operator delete(void* p) noexcept { counted_delete(p); }
void operator delete[](void* p) noexcept { counted_delete(p); }
void operator delete(void* p, std::size_t) noexcept { counted_delete(p); }
void operator delete[](void* p, std::size_t) noexcept { counted_delete(p); }
void operator delete(void* p, std::align_val_t) noexcept { counted_delete(p); }
void operator delete[](void* p, std::align_val_t) noexcept { counted_delete(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { counted_delete(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { counted_delete(p); }
#endif

namespace {

using namespace selfattn;
using selfattn::test::Random;

#ifdef SELFATTN_TEST_UNDER_TSAN
#define SKIP_UNDER_TSAN() GTEST_SKIP() << "under ThreadSanitizer, which owns operator new: no allocation counting"
#else
#define SKIP_UNDER_TSAN() (void)0
#endif

/// What a measured stretch of calls allocated: operator new calls and malloc calls (Eigen's heap allocations).
struct Allocations {
  long long news = 0;
  long long mallocs = 0;
};

/// Runs f() `times` times with operator new and malloc counted.
template <typename F>
Allocations count_allocations(int times, F&& f) {
  new_calls = 0;
  malloc_calls = 0;
  counting = true;
  for (int n = 0; n < times; ++n) f();
  counting = false;
  return {new_calls.load(), malloc_calls.load()};
}

#define EXPECT_NO_ALLOCATION(a)                                                       \
  do {                                                                                \
    EXPECT_EQ((a).news, 0) << "calls of operator new in the steady state";            \
    EXPECT_EQ((a).mallocs, 0) << "calls of malloc (Eigen's heap) in the steady state"; \
  } while (false)

template <typename A, typename B>
bool bitwise_equal(const A& a, const B& b) {
  const auto va = detail::const_view(a);
  const auto vb = detail::const_view(b);
  if (va.shape() != vb.shape()) return false;
  // Compare element by element through the views (either may be strided).
  bool same = true;
  const Index n = va.size();
  std::array<Index, std::tuple_size_v<std::decay_t<decltype(va.shape())>>> index{};
  for (Index flat = 0; flat < n; ++flat) {
    Index rest = flat;
    for (int d = static_cast<int>(index.size()) - 1; d >= 0; --d) {
      index[static_cast<std::size_t>(d)] = rest % va.dim(d);
      rest /= va.dim(d);
    }
    Index oa = 0, ob = 0;
    for (std::size_t d = 0; d < index.size(); ++d) {
      oa += index[d] * va.stride(static_cast<int>(d));
      ob += index[d] * vb.stride(static_cast<int>(d));
    }
    same = same && std::memcmp(va.data() + oa, vb.data() + ob, sizeof(*va.data())) == 0;
  }
  return same;
}

/// Run with one OpenMP thread (the claim holds there in every build); restores the count after.
struct OneThread {
#ifdef _OPENMP
  int before = omp_get_max_threads();
  OneThread() { omp_set_num_threads(1); }
  ~OneThread() { omp_set_num_threads(before); }
#else
  ~OneThread() {}  // NOLINT: user-provided, so that an unused-variable warning does not fire without OpenMP
#endif
};

// The instrument itself: it sees what the allocating forms allocate, and an Eigen heap matrix.
TEST(Counter, SeesOperatorNewAndEigenAllocations) {
  SKIP_UNDER_TSAN();
  Random rng(1);
  const auto q = rng.normal_tensor<float, 4>({1, 2, 1, 16});
  const auto k = rng.normal_tensor<float, 4>({1, 2, 40, 16});
  Tensor<float, 4> out({1, 2, 1, 16});
  Tensor<float, 3> lse({1, 2, 1});
  const Allocations without_workspace = count_allocations(1, [&] { sdpa_forward_into(q, k, k, out, lse); });
  EXPECT_GT(without_workspace.news, 0) << "the form without a workspace allocates its scratch per call";
  const Allocations eigen = count_allocations(1, [&] {
    Eigen::MatrixXf m(64, 64);
    m.setZero();
    EXPECT_EQ(m.sum(), 0.0f);
  });
  EXPECT_GT(eigen.mallocs, 0) << "an Eigen heap matrix is counted";
}

// ---- sdpa_forward_into ------------------------------------------------------------------------------------------

struct ForwardCase {
  const char* name;
  Index batch, heads, kv_heads, q_len, k_len, dim;
  bool mask;  // a per-element mask: the decode kernel's general path
};

class ForwardInto : public ::testing::TestWithParam<ForwardCase> {};

TEST_P(ForwardInto, SteadyStateAllocatesNothingAndMatchesSdpaForward) {
  SKIP_UNDER_TSAN();
  const OneThread one_thread;
  const ForwardCase c = GetParam();
  Random rng(11);
  const auto q = rng.normal_tensor<float, 4>({c.batch, c.heads, c.q_len, c.dim});
  const auto k = rng.normal_tensor<float, 4>({c.batch, c.kv_heads, c.k_len, c.dim});
  const auto v = rng.normal_tensor<float, 4>({c.batch, c.kv_heads, c.k_len, c.dim});
  const auto allowed = rng.bool_tensor<4>({c.batch, 1, c.q_len, c.k_len}, 0.8);
  AttentionOptions<float> opts;
  opts.causal = Causal::bottom_right;
  if (c.mask) opts.allowed = allowed;
  opts.alibi_slopes = alibi_slopes<float>(c.heads);
  opts.key_lengths = std::vector<Index>(static_cast<std::size_t>(c.batch), c.k_len - 3);

  const AttentionForward<float> expected = sdpa_forward(q, k, v, opts);
  Tensor<float, 4> out({c.batch, c.heads, c.q_len, c.dim});
  Tensor<float, 3> lse({c.batch, c.heads, c.q_len});
  AttentionWorkspace<float> ws;
  sdpa_forward_into(q, k, v, out, lse, opts, ws);  // warm-up: the workspace grows here
  const Allocations a = count_allocations(5, [&] { sdpa_forward_into(q, k, v, out, lse, opts, ws); });
  EXPECT_NO_ALLOCATION(a);
  EXPECT_TRUE(bitwise_equal(out, expected.out));
  EXPECT_TRUE(bitwise_equal(lse, expected.lse));

  // A smaller call after a larger one reuses the workspace too (containers only grow).
  const TensorView<const float, 4> fewer_keys(k.data(), {c.batch, c.kv_heads, c.k_len / 2, c.dim}, k.strides());
  const TensorView<const float, 4> fewer_values(v.data(), {c.batch, c.kv_heads, c.k_len / 2, c.dim}, v.strides());
  AttentionOptions<float> half = opts;  // the same kernel path over half the keys
  if (c.mask) half.allowed = TensorView<const bool, 4>(allowed.data(), {c.batch, 1, c.q_len, c.k_len / 2}, allowed.strides());
  half.key_lengths = std::vector<Index>(static_cast<std::size_t>(c.batch), c.k_len / 2 - 3);
  const Allocations smaller =
      count_allocations(1, [&] { sdpa_forward_into(q, fewer_keys, fewer_values, out, lse, half, ws); });
  EXPECT_NO_ALLOCATION(smaller);
  const AttentionForward<float> expected_half = sdpa_forward(q, fewer_keys, fewer_values, half);
  EXPECT_TRUE(bitwise_equal(out, expected_half.out));
}

INSTANTIATE_TEST_SUITE_P(
    Paths, ForwardInto,
    ::testing::Values(ForwardCase{"fused", 2, 4, 2, 128, 200, 64, false},          // Lq = 128: the fused kernel
                      ForwardCase{"fused_masked", 1, 4, 4, 128, 130, 32, true},     // fused with a mask
                      ForwardCase{"decode_streaming", 2, 4, 4, 1, 1000, 64, false},  // Lq = 1, R = 1
                      ForwardCase{"decode_grouped", 2, 8, 2, 1, 1000, 64, false},    // Lq = 1, R = G = 4
                      ForwardCase{"decode_general", 1, 8, 2, 1, 700, 64, true}),     // Lq = 1 with a mask
    [](const ::testing::TestParamInfo<ForwardCase>& info) { return std::string(info.param.name); });

TEST(ForwardIntoErrors, OverlapAndShapeNameTheArgumentAndWriteNothing) {
  Random rng(3);
  auto q = rng.normal_tensor<float, 4>({1, 2, 4, 8});
  const auto k = rng.normal_tensor<float, 4>({1, 2, 6, 8});
  const auto v = rng.normal_tensor<float, 4>({1, 2, 6, 8});
  Tensor<float, 3> lse({1, 2, 4});
  AttentionWorkspace<float> ws;
  test::expect_error<std::invalid_argument>([&] { sdpa_forward_into(q, k, v, q, lse, {}, ws); }, {"sdpa_forward_into", "out", "overlaps q"});
  Tensor<float, 4> wrong({1, 2, 4, 7});
  test::expect_error<ShapeError>([&] { sdpa_forward_into(q, k, v, wrong, lse, {}, ws); }, {"out", "(1, 2, 4, 8)"});
  Tensor<float, 4> out({1, 2, 4, 8});
  std::fill(out.data(), out.data() + out.size(), 7.0f);
  const TensorView<float, 3> lse_in_out(out.data(), {1, 2, 4});
  test::expect_error<std::invalid_argument>([&] { sdpa_forward_into(q, k, v, out, lse_in_out, {}, ws); }, {"lse", "overlaps out"});
  for (Index n = 0; n < out.size(); ++n) ASSERT_EQ(out.data()[n], 7.0f) << "written on error";
}

// ---- sdpa_backward_into -----------------------------------------------------------------------------------------

TEST(BackwardInto, SteadyStateAllocatesNothingAndMatchesSdpaBackward) {
  SKIP_UNDER_TSAN();
  const OneThread one_thread;
  Random rng(5);
  const Index b = 2, h = 4, hkv = 2, lq = 70, lk = 90, d = 32;
  const auto q = rng.normal_tensor<float, 4>({b, h, lq, d});
  const auto k = rng.normal_tensor<float, 4>({b, hkv, lk, d});
  const auto v = rng.normal_tensor<float, 4>({b, hkv, lk, d});
  const auto dout = rng.normal_tensor<float, 4>({b, h, lq, d});
  const auto bias = rng.normal_tensor<float, 4>({1, h, lq, lk});
  for (const bool with_bias : {false, true}) {
    SCOPED_TRACE(with_bias ? "with a bias" : "without a bias");
    AttentionOptions<float> opts;
    opts.causal = Causal::top_left;
    opts.dropout_p = 0.1f;
    opts.seed = 9;
    if (with_bias) opts.bias = bias;
    const AttentionForward<float> fwd = sdpa_forward(q, k, v, opts);
    const AttentionGradients<float> expected = sdpa_backward(q, k, v, fwd.out, fwd.lse, dout, opts);
    Tensor<float, 4> dq(q.shape()), dk(k.shape()), dv(v.shape()), dbias;
    if (with_bias) dbias = Tensor<float, 4>(bias.shape());
    const AttentionGradientViews<float> grads{dq, dk, dv, with_bias ? dbias.view() : TensorView<float, 4>()};
    AttentionWorkspace<float> ws;
    sdpa_backward_into(q, k, v, fwd.out, fwd.lse, dout, grads, opts, ws);
    const Allocations a =
        count_allocations(5, [&] { sdpa_backward_into(q, k, v, fwd.out, fwd.lse, dout, grads, opts, ws); });
    EXPECT_NO_ALLOCATION(a);
    EXPECT_TRUE(bitwise_equal(dq, expected.dq));
    EXPECT_TRUE(bitwise_equal(dk, expected.dk));
    EXPECT_TRUE(bitwise_equal(dv, expected.dv));
    if (with_bias) {
      EXPECT_TRUE(bitwise_equal(dbias, expected.dbias));
    }
  }
}

TEST(BackwardIntoErrors, OverlapContiguityAndShapeNameTheGradient) {
  Random rng(4);
  const auto q = rng.normal_tensor<float, 4>({1, 2, 4, 8});
  const auto k = rng.normal_tensor<float, 4>({1, 2, 6, 8});
  const auto v = rng.normal_tensor<float, 4>({1, 2, 6, 8});
  const auto dout = rng.normal_tensor<float, 4>({1, 2, 4, 8});
  const AttentionForward<float> fwd = sdpa_forward(q, k, v);
  Tensor<float, 4> dq(q.shape()), dk(k.shape()), dv(v.shape()), wrong({1, 2, 5, 8});
  std::fill(dq.data(), dq.data() + dq.size(), 5.0f);
  AttentionWorkspace<float> ws;
  const AttentionOptions<float> none;
  test::expect_error<ShapeError>([&] { sdpa_backward_into(q, k, v, fwd.out, fwd.lse, dout, {wrong, dk, dv}, none, ws); },
                                 {"sdpa_backward_into", "grads.dq", "(1, 2, 4, 8)"});
  test::expect_error<std::invalid_argument>([&] { sdpa_backward_into(q, k, v, fwd.out, fwd.lse, dout, {dq, dk, dk}, none, ws); },
                                            {"grads.dv", "overlaps grads.dk"});
  Tensor<float, 4> k_copy = k;
  test::expect_error<std::invalid_argument>(
      [&] { sdpa_backward_into(q, k_copy, v, fwd.out, fwd.lse, dout, {dq, k_copy, dv}, none, ws); }, {"grads.dk", "overlaps k"});
  const TensorView<float, 4> out_as_dq(const_cast<float*>(fwd.out.data()), fwd.out.shape());
  test::expect_error<std::invalid_argument>(
      [&] { sdpa_backward_into(q, k, v, fwd.out, fwd.lse, dout, {out_as_dq, dk, dv}, none, ws); }, {"grads.dq", "overlaps out"});
  Tensor<float, 4> wide({1, 2, 6, 16});
  const TensorView<float, 4> strided_dk(wide.data(), {1, 2, 6, 8}, wide.strides());
  test::expect_error<std::invalid_argument>(
      [&] { sdpa_backward_into(q, k, v, fwd.out, fwd.lse, dout, {dq, strided_dk, dv}, none, ws); }, {"grads.dk", "contiguous"});
  Tensor<float, 4> stray({1, 2, 4, 6});
  test::expect_error<std::invalid_argument>(
      [&] { sdpa_backward_into(q, k, v, fwd.out, fwd.lse, dout, {dq, dk, dv, stray}, none, ws); }, {"grads.dbias", "without opts.bias"});
  for (Index n = 0; n < dq.size(); ++n) ASSERT_EQ(dq.data()[n], 5.0f) << "written on error";
}

// ---- MultiHeadAttention::step_into ------------------------------------------------------------------------------

struct StepCase {
  const char* name;
  Index batch, heads, kv_heads, embed;
  Index rope_dim;
  bool alibi;
  CachePolicy policy;
  Index prompt;
};

class StepInto : public ::testing::TestWithParam<StepCase> {};

TEST_P(StepInto, SteadyStateAllocatesNothingAndMatchesStep) {
  SKIP_UNDER_TSAN();
  const OneThread one_thread;
  const StepCase c = GetParam();
  const MultiHeadAttention<float> mha(
      test::ModuleConfig(c.embed, c.heads).kv_heads(c.kv_heads).rope(c.rope_dim).with_alibi(c.alibi), 42);
  Random rng(8);
  const int steps = 40;
  const auto prompt = rng.normal_tensor<float, 3>({c.batch, c.prompt, c.embed});
  std::vector<Tensor<float, 3>> tokens;
  for (int t = 0; t < steps + 1; ++t) tokens.push_back(rng.normal_tensor<float, 3>({c.batch, 1, c.embed}));

  KVCache<float> by_step = mha.make_cache(c.batch, c.policy), by_step_into = mha.make_cache(c.batch, c.policy);
  if (!c.policy.evicts()) by_step_into.reserve(c.prompt + steps + 1);
  Tensor<float, 3> prefill({c.batch, c.prompt, c.embed});
  mha.step_into(prompt, by_step_into, prefill);
  EXPECT_TRUE(bitwise_equal(prefill, mha.step(prompt, by_step)));

  Tensor<float, 3> y({c.batch, 1, c.embed});
  mha.step_into(tokens[0], by_step_into, y);  // warm-up of the one-token shape
  EXPECT_TRUE(bitwise_equal(y, mha.step(tokens[0], by_step)));
  for (int t = 1; t <= steps; ++t) {
    const Allocations a = count_allocations(1, [&] { mha.step_into(tokens[static_cast<std::size_t>(t)], by_step_into, y); });
    EXPECT_NO_ALLOCATION(a);
    const Tensor<float, 3> expected = mha.step(tokens[static_cast<std::size_t>(t)], by_step);
    ASSERT_TRUE(bitwise_equal(y, expected)) << "step " << t;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Caches, StepInto,
    ::testing::Values(StepCase{"rope_gqa_keep_all", 2, 8, 2, 128, 16, false, CachePolicy::keep_all(), 300},
                      StepCase{"alibi_mha_keep_all", 1, 4, 4, 64, 0, true, CachePolicy::keep_all(), 20},
                      StepCase{"rope_gqa_sliding_window", 2, 8, 2, 128, 16, false, CachePolicy::sliding_window(64), 100},
                      StepCase{"rope_sinks", 1, 4, 1, 64, 16, false, CachePolicy::attention_sinks(4, 32), 50}),
    [](const ::testing::TestParamInfo<StepCase>& info) { return std::string(info.param.name); });

// The module the 16-bit steady-state tests step: E = 64, four query heads over two key/value heads, RoPE.
MultiHeadAttentionConfig grouped_rope_config() { return test::ModuleConfig(64, 4).kv_heads(2).rope(16); }

// step_into_with on 16-bit parameters: after the first step of a shape, neither single tokens (weights read in
// place) nor 20-row chunks (weights widened into the cache's workspace; a 16-bit cache's keys and values widened a
// tile at a time by the fused kernel) allocate, over a float or a 16-bit cache growing within its capacity.
template <typename S>
void expect_steady_steps_with_half_weights(Index rows) {
  const MultiHeadAttention<float> mha(grouped_rope_config(), 42);
  const MhaParams<bfloat16> weights = params_cast<bfloat16>(mha.params());
  KVCache<float, S> cache = mha.make_cache<S>(1);
  cache.reserve(200);
  Random rng(4);
  Tensor<float, 3> y({1, rows, 64});
  mha.step_into_with(weights, rng.normal_tensor<float, 3>({1, rows, 64}), cache, y.view());  // warm-up of the shape
  for (int t = 0; t < 3; ++t) {
    SCOPED_TRACE(std::to_string(rows) + " rows, step " + std::to_string(t));
    const Tensor<float, 3> x = rng.normal_tensor<float, 3>({1, rows, 64});
    const Allocations a = count_allocations(1, [&] { mha.step_into_with(weights, x, cache, y.view()); });
    EXPECT_NO_ALLOCATION(a);
  }
}

TEST(StepIntoWith, SixteenBitParametersAllocateNothingInTheSteadyState) {
  SKIP_UNDER_TSAN();
  const OneThread one_thread;
  for (Index rows : {Index(1), Index(20)}) {
    expect_steady_steps_with_half_weights<bfloat16>(rows);
    expect_steady_steps_with_half_weights<float>(rows);
  }
}

// step_into and step_into_with on bfloat16 activations (x_new and output 16-bit): the widened input and the float
// output before its rounding live in the cache's workspace, so steady steps allocate nothing either.
TEST(StepIntoWith, SixteenBitActivationsAllocateNothingInTheSteadyState) {
  SKIP_UNDER_TSAN();
  const OneThread one_thread;
  const MultiHeadAttention<float> mha(grouped_rope_config(), 42);
  const MhaParams<bfloat16> weights = params_cast<bfloat16>(mha.params());
  for (const Index rows : {Index(1), Index(20)}) {
    KVCache<float, bfloat16> cache = mha.make_cache<bfloat16>(1);
    cache.reserve(200);
    Random rng(4);
    Tensor<bfloat16, 3> y({1, rows, 64});
    const Tensor<bfloat16, 3> warm_up = tensor_cast<bfloat16>(rng.normal_tensor<float, 3>({1, rows, 64}));
    mha.step_into(warm_up, cache, y);  // the first call of the shape with each kind of weights
    mha.step_into_with(weights, warm_up, cache, y);
    for (int t = 0; t < 3; ++t) {
      SCOPED_TRACE(std::to_string(rows) + " rows, step " + std::to_string(t));
      const Tensor<bfloat16, 3> x = tensor_cast<bfloat16>(rng.normal_tensor<float, 3>({1, rows, 64}));
      const Allocations float_weights = count_allocations(1, [&] { mha.step_into(x, cache, y); });
      EXPECT_NO_ALLOCATION(float_weights);
      const Allocations half_weights = count_allocations(1, [&] { mha.step_into_with(weights, x, cache, y); });
      EXPECT_NO_ALLOCATION(half_weights);
    }
  }
}

TEST(StepIntoErrors, OutputOverlapAndShapeNameTheArgumentAndLeaveTheCache) {
  const MultiHeadAttention<float> mha(test::ModuleConfig(16, 2), 1);
  Random rng(2);
  auto x = rng.normal_tensor<float, 3>({1, 3, 16});
  KVCache<float> cache = mha.make_cache(1);
  Tensor<float, 3> wrong({1, 2, 16});
  test::expect_error<ShapeError>([&] { mha.step_into(x, cache, wrong); }, {"MultiHeadAttention::step_into", "output", "(1, 3, 16)"});
  test::expect_error<std::invalid_argument>([&] { mha.step_into(x, cache, x.view()); }, {"output", "overlaps x_new"});
  EXPECT_EQ(cache.lengths()[0], 0) << "the cache is unchanged on error";
}

// ---- MultiHeadAttention::forward_into ---------------------------------------------------------------------------

// The module of the forward_into tests: self-attention (key and value are the query: `kv` below), or cross-attention
// over a memory of width 24.
MultiHeadAttention<float> forward_into_module(test::ModuleConfig cfg, bool self) {
  return MultiHeadAttention<float>(cfg.input_dims(self ? 0 : 24, self ? 0 : 24), 3);
}

TEST(ForwardIntoModule, SteadyStateAllocatesNothingAndMatchesForward) {
  SKIP_UNDER_TSAN();
  const OneThread one_thread;
  for (const bool self : {true, false})
    for (const Index q_len : {Index(1), Index(40)}) {
      SCOPED_TRACE(std::string(self ? "self" : "cross") + "-attention, Lq = " + std::to_string(q_len));
      const auto mha = forward_into_module(test::ModuleConfig(64, 4).kv_heads(2).rope(16).with_alibi(true), self);
      Random rng(6);
      const auto query = rng.normal_tensor<float, 3>({2, q_len, 64});
      const auto memory = rng.normal_tensor<float, 3>({2, 50, 24});
      AttentionOptions<float> opts;
      opts.causal = self ? Causal::top_left : Causal::none;
      Tensor<float, 3> y({2, q_len, 64});
      MhaWorkspace<float> ws;
      const auto& kv = self ? query : memory;
      const auto call = [&] { mha.forward_into(query, kv, kv, y, ws, opts); };
      call();
      const Allocations a = count_allocations(5, call);
      EXPECT_NO_ALLOCATION(a);
      const MhaForward<float> expected = self ? mha.forward(query, opts) : mha.forward(query, memory, memory, opts);
      EXPECT_TRUE(bitwise_equal(y, expected.output));
    }
}

// forward_into_with on bfloat16 parameters: the widened weights of each projection (q, k and v of cross-attention
// apart, the output's) live in the workspace, so a second call of a shape allocates nothing; 1 row reads them in place.
TEST(ForwardIntoModule, SixteenBitParametersAllocateNothingInTheSteadyState) {
  SKIP_UNDER_TSAN();
  const OneThread one_thread;
  for (const bool self : {true, false})
    for (const Index q_len : {Index(1), Index(40)}) {
      SCOPED_TRACE(std::string(self ? "self" : "cross") + "-attention, Lq = " + std::to_string(q_len));
      const auto mha = forward_into_module(test::ModuleConfig(64, 4).kv_heads(2), self);
      const MhaParams<bfloat16> weights = params_cast<bfloat16>(mha.params());
      Random rng(6);
      const auto query = rng.normal_tensor<float, 3>({2, q_len, 64});
      const auto memory = rng.normal_tensor<float, 3>({2, 50, 24});
      Tensor<float, 3> y({2, q_len, 64});
      MhaWorkspace<float> ws;
      const auto& kv = self ? query : memory;
      const auto call = [&] { mha.forward_into_with(weights, query, kv, kv, y.view(), ws); };
      call();
      const Allocations a = count_allocations(5, call);
      EXPECT_NO_ALLOCATION(a);
    }
}

// forward_into on bfloat16 activations (query, key, value and output): the widened inputs (once for self-attention)
// and the float output live in the workspace: no allocation after the first call of a shape.
TEST(ForwardIntoModule, SixteenBitActivationsAllocateNothingInTheSteadyState) {
  SKIP_UNDER_TSAN();
  const OneThread one_thread;
  for (const bool self : {true, false}) {
    SCOPED_TRACE(self ? "self-attention" : "cross-attention");
    const auto mha = forward_into_module(test::ModuleConfig(64, 4), self);
    Random rng(6);
    const auto query = tensor_cast<bfloat16>(rng.normal_tensor<float, 3>({2, 40, 64}));
    const auto memory = tensor_cast<bfloat16>(rng.normal_tensor<float, 3>({2, 50, 24}));
    Tensor<bfloat16, 3> y({2, 40, 64});
    MhaWorkspace<float> ws;
    const auto& kv = self ? query : memory;
    const auto call = [&] { mha.forward_into(query, kv, kv, y, ws); };
    call();
    const Allocations a = count_allocations(5, call);
    EXPECT_NO_ALLOCATION(a);
  }
}

TEST(ForwardIntoModuleErrors, NameTheArgument) {
  const MultiHeadAttention<float> mha(test::ModuleConfig(16, 2), 1);
  Random rng(2);
  auto x = rng.normal_tensor<float, 3>({1, 3, 16});
  Tensor<float, 3> y({1, 3, 16});
  MhaWorkspace<float> ws;
  AttentionOptions<float> weights;
  weights.need_weights = true;
  test::expect_error<std::invalid_argument>([&] { mha.forward_into(x, x, x, y, ws, weights); },
                                            {"MultiHeadAttention::forward_into", "opts.need_weights"});
  test::expect_error<std::invalid_argument>([&] { mha.forward_into(x, x, x, x.view(), ws); }, {"output", "overlaps query"});
  Tensor<float, 3> wrong({1, 4, 16});
  test::expect_error<ShapeError>([&] { mha.forward_into(x, x, x, wrong, ws); }, {"output", "(1, 3, 16)"});
}

// The forward's scratch memory is O(tile): the workspace size does not grow with the lengths, and counting every
// byte through operator new during a call with Lq = Lk = 1024 finds only the outputs and the tile workspace,
// nowhere near one (Lq, Lk) matrix (4 MB in float); Eigen allocates nothing on the heap meanwhile.
TEST(FusedForward, AllocatesNoScoreMatrix) {
  const std::size_t workspace = detail::fused_forward_workspace_bytes<float>(128, 128);
  EXPECT_LT(workspace, std::size_t(256) * 1024) << "one thread's tile workspace at D = Dv = 128";
  SKIP_UNDER_TSAN();

  const Index L = 1024, D = 8;
  Random random(47);
  const auto q = random.normal_tensor<float, 4>({1, 1, L, D});
  const auto k = random.normal_tensor<float, 4>({1, 1, L, D});
  const auto v = random.normal_tensor<float, 4>({1, 1, L, D});
  AttentionOptions<float> opts;
  opts.causal = Causal::top_left;
  const long long outputs = static_cast<long long>((L * D + L) * sizeof(float));
  const long long score_matrix = static_cast<long long>(L * L * sizeof(float));
  for (int threads : {1, detail::max_threads()}) {
#ifdef _OPENMP
    omp_set_num_threads(threads);
#endif
    live_bytes = 0;
    peak_bytes = 0;
    const Allocations allocations = count_allocations(1, [&] {
      const auto fwd = sdpa_forward(q, k, v, opts);
      EXPECT_EQ(fwd.out.size(), L * D);
    });
    EXPECT_EQ(allocations.mallocs, 0) << "Eigen heap allocations inside the fused forward";
    const long long scratch = peak_bytes.load() - outputs;
    RecordProperty("threads", threads);
    RecordProperty("peak_scratch_bytes", static_cast<int>(scratch));
    const auto workspace_bytes = static_cast<long long>(detail::fused_forward_workspace_bytes<float>(D, D));
    EXPECT_LE(scratch, threads * workspace_bytes + 4096)
        << "peak " << peak_bytes.load() << " bytes, outputs " << outputs;
    EXPECT_LT(peak_bytes.load(), score_matrix / 16);
    EXPECT_EQ(live_bytes.load(), 0) << "everything allocated during the call is returned or freed with the result";
  }
}

// A 16-bit call's fused forward holds no float copy of q or of out (1 MiB at 2048 rows): counting every byte finds its
// outputs (out in 16 bits, lse in float), the tile workspace and, where the BF16 dot products run, their copy of V
// transposed into pairs (2 bytes per value element). Before, q and out were widened whole into float buffers.
template <typename S>
void expect_no_float_copies(const char* type) {
  // Under a sanitizer 1024 rows, a quarter of the work (2048 took 64 s there, AMD EPYC Zen 3): a float copy of q
  // still overflows the bound, as the first check below makes sure.
  const Index L = test::sanitized ? 1024 : 2048, D = 64;
  Random random(48);
  const auto q = tensor_cast<S>(random.normal_tensor<float, 4>({1, 1, L, D}));
  const auto k = tensor_cast<S>(random.normal_tensor<float, 4>({1, 1, L, D}));
  const auto v = tensor_cast<S>(random.normal_tensor<float, 4>({1, 1, L, D}));
  AttentionOptions<float> opts;
  opts.causal = Causal::top_left;
  opts.kernel = Kernel::fused;
  const long long outputs = static_cast<long long>(L * D * sizeof(S) + L * sizeof(float));
  const long long value_pairs = static_cast<long long>(L * D * sizeof(S));
  const long long float_copy = static_cast<long long>(L * D * sizeof(float));
  // Once uncounted, on a few rows: the first call detects the CPU and keeps what it found for the process (905 bytes).
  const auto few = tensor_cast<S>(random.normal_tensor<float, 4>({1, 1, 16, D}));
  static_cast<void>(sdpa_forward(few, few, few, opts));
  std::vector<int> thread_counts{1};
  if (detail::max_threads() > 1) thread_counts.push_back(detail::max_threads());
  for (int threads : thread_counts) {
#ifdef _OPENMP
    omp_set_num_threads(threads);
#endif
    // The tile workspace, and the BF16 products' query and probability pairs: far below a float copy of q.
    const auto workspace = static_cast<long long>(detail::fused_forward_workspace_bytes<float>(D, D)) + 65536;
    const long long bound = threads * workspace + value_pairs;
    ASSERT_GT(float_copy, bound) << "a float copy of q would fit in the bound: L = " << L << " is too short to see one";
    live_bytes = 0;
    peak_bytes = 0;
    count_allocations(1, [&] { EXPECT_EQ(sdpa_forward(q, k, v, opts).out.size(), L * D); });
    EXPECT_LE(peak_bytes.load() - outputs, bound)
        << type << ", " << threads << " threads: peak " << peak_bytes.load() << " bytes, outputs " << outputs;
    EXPECT_EQ(live_bytes.load(), 0) << type << ", " << threads << " threads";
  }
}

TEST(FusedForward, SixteenBitCallHoldsNoFloatCopies) {
  SKIP_UNDER_TSAN();
  expect_no_float_copies<bfloat16>("bfloat16");
  expect_no_float_copies<float16>("float16");
}

// ---- threads ----------------------------------------------------------------------------------------------------

// With OpenMP and 2 threads the kernels grow their per-thread scratch on the first call with 2 threads; after
// that the steady state allocates nothing in our code. What the OpenMP runtime itself allocates is counted too.
TEST(Threads, TwoThreadSteadyStateOfTheKernels) {
  SKIP_UNDER_TSAN();
#ifndef _OPENMP
  GTEST_SKIP() << "built without OpenMP: every call runs on one thread (see the other tests)";
#else
  const int before = omp_get_max_threads();
  omp_set_num_threads(2);
  Random rng(12);
  const auto q = rng.normal_tensor<float, 4>({2, 8, 256, 64});
  const auto k = rng.normal_tensor<float, 4>({2, 2, 1024, 64});
  const auto v = rng.normal_tensor<float, 4>({2, 2, 1024, 64});
  const TensorView<const float, 4> q1(q.data(), {2, 8, 1, 64}, q.strides());
  Tensor<float, 4> out({2, 8, 256, 64}), out1({2, 8, 1, 64});
  Tensor<float, 3> lse({2, 8, 256}), lse1({2, 8, 1});
  AttentionWorkspace<float> ws;
  sdpa_forward_into(q, k, v, out, lse, {}, ws);
  sdpa_forward_into(q1, k, v, out1, lse1, {}, ws);
  const Allocations fused = count_allocations(3, [&] { sdpa_forward_into(q, k, v, out, lse, {}, ws); });
  const Allocations decode = count_allocations(3, [&] { sdpa_forward_into(q1, k, v, out1, lse1, {}, ws); });
  omp_set_num_threads(before);
  std::cout << "2 threads: fused " << fused.news << " operator new calls / 3 calls, decode " << decode.news << "\n";
  EXPECT_NO_ALLOCATION(fused);
  EXPECT_NO_ALLOCATION(decode);
#endif
}

}  // namespace
