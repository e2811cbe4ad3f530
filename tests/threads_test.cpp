// Thread counts change nothing but rounding (docs/numerics.md, "Determinism"): the fused forward and both fast
// decode paths are bitwise the same at 1 and 2 threads, the fused backward (per-thread dQ and dbias accumulators,
// summed in thread order) equal to rounding and bitwise repeatable at one count, and so is the module on top.
// Every case is large enough for the kernels to open their OpenMP loops (threads.hpp: 2^20 multiply-adds).
//
// Without OpenMP there is one thread count, and each test skips itself saying so; scripts/test's release stage
// builds with OpenMP and fails if any skipped, and its tsan stage runs this file under ThreadSanitizer.
#include <selfattn/selfattn.hpp>

#include "support/brute_force.hpp"
#include "support/compare.hpp"
#include "support/module_config.hpp"
#include "support/random.hpp"
#include "support/scalars.hpp"

#include <gtest/gtest.h>

#include <utility>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace selfattn::test {
namespace {

using detail::DecodePath;

#ifdef _OPENMP
// Runs f() with `threads` OpenMP threads, then restores the count it found.
template <typename F>
auto with_threads(int threads, F&& f) {
  const int saved = omp_get_max_threads();
  omp_set_num_threads(threads);
  auto result = f();
  omp_set_num_threads(saved);
  return result;
}
#define SELFATTN_SKIP_WITHOUT_OPENMP()
#else
#define SELFATTN_SKIP_WITHOUT_OPENMP()                                                                     \
  GTEST_SKIP() << "built without OpenMP, so there is one thread count to compare (scripts/test's release " \
                  "stage builds with -DSELFATTN_OPENMP=ON)"
#endif

// The forward is bitwise independent of the thread count (each row is one thread's, in a fixed order); the
// backward agrees across counts up to rounding and is bitwise repeatable at each.
TEST(FusedTest, ThreadCountChangesNothingButRounding) {
  SELFATTN_SKIP_WITHOUT_OPENMP();
#ifdef _OPENMP
  Random random(45);
  const auto q = random.normal_tensor<double, 4>({1, 4, 200, 32});
  const auto k = random.normal_tensor<double, 4>({1, 2, 300, 32});
  const auto v = random.normal_tensor<double, 4>({1, 2, 300, 16});
  const auto dout = random.normal_tensor<double, 4>({1, 4, 200, 16});
  // (1, 1, 1, Lk): every key/value head's tasks add into the same dbias elements, so each thread accumulates
  // its own copy. (A bias constant along the keys, (.., Lq, 1), would not do: softmax ignores it, dbias = 0.)
  const auto bias = random.normal_tensor<double, 4>({1, 1, 1, 300});
  AttentionOptions<double> opts;
  opts.causal = Causal::bottom_right;
  opts.bias = bias;
  const auto one = with_threads(1, [&] { return sdpa_forward(q, k, v, opts); });
  const auto g_one = with_threads(1, [&] { return sdpa_backward(q, k, v, one.out, one.lse, dout, opts); });
  const auto three = with_threads(3, [&] { return sdpa_forward(q, k, v, opts); });
  const auto g_three = with_threads(3, [&] { return sdpa_backward(q, k, v, one.out, one.lse, dout, opts); });
  const auto g_three_again = with_threads(3, [&] { return sdpa_backward(q, k, v, one.out, one.lse, dout, opts); });
  EXPECT_TRUE(all_close(three.out, one.out, 0.0));
  EXPECT_TRUE(all_close(three.lse, one.lse, 0.0));
  for (const auto& [x, y] : {std::pair(&g_three.dq, &g_one.dq), std::pair(&g_three.dk, &g_one.dk),
                             std::pair(&g_three.dv, &g_one.dv), std::pair(&g_three.dbias, &g_one.dbias)})
    EXPECT_TRUE(all_close(*x, *y, 1e-13));
  EXPECT_TRUE(all_close(g_three.dq, g_three_again.dq, 0.0));
  EXPECT_TRUE(all_close(g_three.dbias, g_three_again.dbias, 0.0));
  const auto expected = test::brute_force_backward<double>(q, k, v, dout, opts);
  EXPECT_TRUE(all_close(g_three.dbias, expected.dbias, default_tolerance<double>()));
#endif
}

SELFATTN_SCALAR_TEST_SUITE(DecodeThreadsTest);

// One decode step of `path` on 1 and 2 threads, and again on 1: the partials of the chunks are merged in chunk
// order whoever computed them, so all three are the same bits; and they are the brute force's result.
template <typename T>
void check_decode_threads(DecodePath path, Index heads, Index kv_heads, std::uint64_t seed) {
  Random random(seed);
  const Index Lk = 2000, D = 64;
  const auto q = random.normal_tensor<T, 4>({1, heads, 1, D});
  const auto k = random.normal_tensor<T, 4>({1, kv_heads, Lk, D});
  const auto v = random.normal_tensor<T, 4>({1, kv_heads, Lk, D});
  AttentionOptions<T> opts;
  opts.alibi_slopes = alibi_slopes<T>(heads);
  const auto params = detail::make_params<T>(q, k, v, opts);
  const auto run = [&] {
    Tensor<T, 4> out({1, heads, 1, D});
    Tensor<T, 3> lse({1, heads, 1});
    detail::decode_forward(params, detail::ForwardOutputs<T>{out.view(), lse.view(), {}}, path);
    return out;
  };
#ifdef _OPENMP
  const Tensor<T, 4> one = with_threads(1, run), two = with_threads(2, run), again = with_threads(1, run);
#else
  const Tensor<T, 4> one = run(), two = run(), again = run();
#endif
  EXPECT_TRUE(all_close(two, one, 0.0));
  EXPECT_TRUE(all_close(again, one, 0.0));
  EXPECT_TRUE(all_close(one, test::brute_force_attention<T>(q, k, v, opts).out, default_tolerance<T>()));
}

// G = 8 query rows per key/value head: the grouped path.
TYPED_TEST(DecodeThreadsTest, GroupedResultDoesNotDependOnTheThreadCount) {
  SELFATTN_SKIP_WITHOUT_OPENMP();
  check_decode_threads<TypeParam>(DecodePath::grouped, 16, 2, 507);
}

// G = 2: the streaming path.
TYPED_TEST(DecodeThreadsTest, StreamingResultDoesNotDependOnTheThreadCount) {
  SELFATTN_SKIP_WITHOUT_OPENMP();
  check_decode_threads<TypeParam>(DecodePath::streaming, 4, 2, 516);
}

// The module on top: forward, backward and a decode step at 1 and 2 threads, E = 256, 8 heads over 2 key/value
// heads, L = 300 (the kernels and Eigen's projections both thread), causal with RoPE and a bias on every
// projection. Forward and step are the same bits; the backward agrees to rounding.
TEST(ModuleThreadsTest, ThreadCountChangesNothingButRounding) {
  SELFATTN_SKIP_WITHOUT_OPENMP();
#ifdef _OPENMP
  MultiHeadAttention<double> mha(ModuleConfig(256, 8).kv_heads(2).rope(32), 9);
  Random random(46);
  randomize_biases(mha, random);
  const auto x = random.normal_tensor<double, 3>({1, 300, 256});
  const auto dout = random.normal_tensor<double, 3>({1, 300, 256});
  AttentionOptions<double> opts;
  opts.causal = Causal::top_left;
  const auto forward_backward = [&] {
    const MhaForward<double> f = mha.forward(x, opts);
    return std::pair(f.output, mha.backward(dout, f));
  };
  const auto [y_one, g_one] = with_threads(1, forward_backward);
  const auto [y_two, g_two] = with_threads(2, forward_backward);
  EXPECT_TRUE(all_close(y_two, y_one, 1e-13));  // Eigen's projections block by thread count
  EXPECT_TRUE(all_close(g_two.d_query, g_one.d_query, 1e-12));
  EXPECT_TRUE(all_close(g_two.params.k_weight, g_one.params.k_weight, 1e-12));
  EXPECT_TRUE(all_close(g_two.params.out_weight, g_one.params.out_weight, 1e-12));
  const auto step = [&] {
    auto cache = mha.make_cache(1);
    return mha.step(x, cache);
  };
  EXPECT_TRUE(all_close(with_threads(2, step), with_threads(1, step), 1e-13));
  EXPECT_TRUE(all_close(with_threads(2, step), y_one, 1e-12)) << "the prefill step equals the causal forward";
#endif
}

}  // namespace
}  // namespace selfattn::test
