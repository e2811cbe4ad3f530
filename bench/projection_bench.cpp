// projection_bench.cpp — the multi-head module's projections (the Q/K/V and output linear layers) and the module's
// forward end to end, so that the same source can be timed with Eigen's own GEMM and with Eigen handing its
// products to a BLAS (EIGEN_USE_BLAS, OpenBLAS). Results and commands: docs/performance.md ("Eigen with OpenBLAS").
//
// Built twice by bench/CMakeLists.txt:
//   bench_projection_bench           plain Eigen (always; its smoke test runs in CI)
//   bench_projection_bench_openblas  -DEIGEN_USE_BLAS -DSELFATTN_BENCH_OPENBLAS, linked to OpenBLAS (only with
//                                    -DSELFATTN_BENCH_OPENBLAS=ON and BLAS found; off by default)
// EIGEN_USE_BLAS changes which specialisation of Eigen's inline product templates a translation unit sees, so it
// must be defined in every translation unit of a program or in none (ODR). This program is one translation unit.
//
// Shapes: float, B = 1, self-attention x (B, L, E), E in {512, 1024}, head dim 64 (H = E / 64), L in
// {128, 512, 1024, 2048, 4096}, with bias (the module's default).
//   BM_linear/L/E:e/threads:t           linear(x, W, b), W (E, E): one projection, y = x W^T + b
//   BM_linear_backward/L/E:e/threads:t  linear_backward(x, W, dy): dx = dy W, dW = dy^T x, db = sum dy
//   BM_qkv_projection/L/E:e/threads:t   the module's fused Q|K|V projection: x [Wq; Wk; Wv]^T + b, (B, L, 3E)
//   BM_mha_forward/L/E:e/threads:t      MultiHeadAttention<float>::forward(x): projections + fused attention
//   BM_mha_forward_backward/...         the same, forward and backward
// threads:t: omp_set_num_threads(t) and Eigen::setNbThreads(t) (Eigen's GEMM threads itself only under OpenMP);
// in the OpenBLAS build also openblas_set_num_threads(t): Eigen does not split a product it hands to the BLAS
// (Parallelizer.h), so OpenBLAS's own threads are the GEMM's threads there.
//
// Counters: FLOP/s (per second of the process's CPU time, all threads), wall_FLOP/s (per second of wall time).
//   linear 2 B L E^2; linear_backward 4 B L E^2 (db not counted); qkv 6 B L E^2;
//   mha forward 8 B L E^2 (four projections) + 4 B H L^2 Dh = 4 B L^2 E (attention, both GEMMs);
//   mha forward + backward: 3 x the projections' 8 B L E^2 + 3.5 x the attention's 4 B L^2 E (as fused_bench).
// L appears bare (BM_linear/128/E:512/...) so that the ctest smoke filter /128(/|$) picks the small cases.

// g++ 12 with -march=native on AVX-512: false "'__Y' may be used uninitialized" inside avx512fintrin.h (GCC bug
// 105593); off before Eigen is first included (see fused_bench.cpp).
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <benchmark/benchmark.h>

#include <selfattn/selfattn.hpp>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#ifdef SELFATTN_BENCH_OPENBLAS
// OpenBLAS's own entry points (cblas.h declares them too, but its location differs between distributions).
extern "C" {
void openblas_set_num_threads(int num_threads);
char* openblas_get_config(void);
}
#endif

using namespace selfattn;

namespace {

constexpr Index kBatch = 1;
constexpr Index kHeadDim = 64;

#ifdef SELFATTN_BENCH_OPENBLAS
// Names the BLAS in the JSON/console context, so that two result files cannot be confused.
const bool blas_context_added = [] {
  benchmark::AddCustomContext("blas", openblas_get_config());
  return true;
}();
#else
const bool blas_context_added = [] {
  benchmark::AddCustomContext("blas", "none (Eigen's own GEMM)");
  return true;
}();
#endif

template <int Rank>
void fill(Tensor<float, Rank>& x, double phase, double amplitude = 1.0) {
  for (Index i = 0; i < x.size(); ++i)
    x.data()[i] = static_cast<float>(amplitude * std::sin(0.37 * static_cast<double>(i) + phase));
}

void set_threads(int threads) {
#ifdef _OPENMP
  omp_set_num_threads(threads);
#endif
  Eigen::setNbThreads(threads);
#ifdef SELFATTN_BENCH_OPENBLAS
  openblas_set_num_threads(threads);
#endif
}

// Runs `body` in the benchmark loop and sets the FLOP counters (CPU time and wall time).
template <typename Body>
void timed(benchmark::State& state, double flops, Body&& body) {
  const auto start = std::chrono::steady_clock::now();
  for (auto _ : state) body();
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  state.counters["FLOP/s"] = benchmark::Counter(flops, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["wall_FLOP/s"] = benchmark::Counter(flops * static_cast<double>(state.iterations()) / wall);
}

// Arguments of every benchmark: L (bare), E, threads.
struct Shape {
  Index length, embed;
  explicit Shape(const benchmark::State& state) : length(state.range(0)), embed(state.range(1)) {
    (void)blas_context_added;
    set_threads(static_cast<int>(state.range(2)));
  }
  double rows() const { return static_cast<double>(kBatch * length); }
  double e() const { return static_cast<double>(embed); }
};

struct LinearInputs {
  Tensor<float, 3> x;
  Tensor<float, 2> w;
  Tensor<float, 1> b;
  LinearInputs(Index length, Index in, Index out)
      : x({kBatch, length, in}), w({out, in}), b(std::array<Index, 1>{out}) {
    fill(x, 0.1);
    fill(w, 0.2, 1.0 / std::sqrt(static_cast<double>(in)));
    fill(b, 0.3);
  }
};

void BM_linear(benchmark::State& state) {
  const Shape s(state);
  const LinearInputs in(s.length, s.embed, s.embed);
  timed(state, 2.0 * s.rows() * s.e() * s.e(), [&] {
    Tensor<float, 3> y = linear<float>(in.x, in.w, in.b);  // y = x W^T + b
    float* out = y.data();
    benchmark::DoNotOptimize(out);
    benchmark::ClobberMemory();
  });
}

void BM_linear_backward(benchmark::State& state) {
  const Shape s(state);
  const LinearInputs in(s.length, s.embed, s.embed);
  Tensor<float, 3> dy({kBatch, s.length, s.embed});
  fill(dy, 0.4);
  timed(state, 4.0 * s.rows() * s.e() * s.e(), [&] {
    LinearGradients<float> g = linear_backward<float>(in.x, in.w, dy, true);  // dx = dy W, dW = dy^T x
    float* out = g.dweight.data();
    benchmark::DoNotOptimize(out);
    benchmark::ClobberMemory();
  });
}

void BM_qkv_projection(benchmark::State& state) {
  const Shape s(state);
  const LinearInputs q(s.length, s.embed, s.embed), k(1, s.embed, s.embed), v(1, s.embed, s.embed);
  timed(state, 6.0 * s.rows() * s.e() * s.e(), [&] {
    Tensor<float, 3> y = detail::fused_qkv_projection<float>(q.x, {q.w.view(), k.w.view(), v.w.view()},
                                                             {q.b.view(), k.b.view(), v.b.view()});
    float* out = y.data();
    benchmark::DoNotOptimize(out);
    benchmark::ClobberMemory();
  });
}

MultiHeadAttentionConfig module_config(Index embed) {
  MultiHeadAttentionConfig cfg;
  cfg.embed_dim = embed;
  cfg.num_heads = embed / kHeadDim;
  return cfg;
}

// Nominal FLOPs of the module's forward: four projections (2 B L E^2 each) and attention (4 B H L^2 Dh = 4 B L^2 E).
double projection_flops(const Shape& s) { return 8.0 * s.rows() * s.e() * s.e(); }
double attention_flops(const Shape& s) { return 4.0 * s.rows() * static_cast<double>(s.length) * s.e(); }

void BM_mha_forward(benchmark::State& state) {
  const Shape s(state);
  const MultiHeadAttention<float> mha(module_config(s.embed));
  Tensor<float, 3> x({kBatch, s.length, s.embed});
  fill(x, 0.5);
  timed(state, projection_flops(s) + attention_flops(s), [&] {
    MhaForward<float> fwd = mha.forward(x);
    float* out = fwd.output.data();
    benchmark::DoNotOptimize(out);
    benchmark::ClobberMemory();
  });
}

void BM_mha_forward_backward(benchmark::State& state) {
  const Shape s(state);
  const MultiHeadAttention<float> mha(module_config(s.embed));
  Tensor<float, 3> x({kBatch, s.length, s.embed}), dy(x.shape());
  fill(x, 0.5);
  fill(dy, 0.6);
  // The backward of each projection is two GEMMs of the forward's size; the attention's backward is 2.5 forwards.
  timed(state, 3.0 * projection_flops(s) + 3.5 * attention_flops(s), [&] {
    const MhaForward<float> fwd = mha.forward(x);
    const MhaGradients<float> g = mha.backward(dy, fwd);
    const float* out = g.d_query.data();
    benchmark::DoNotOptimize(out);
    benchmark::ClobberMemory();
  });
}

std::vector<int64_t> thread_counts() {
#if defined(_OPENMP) || defined(SELFATTN_BENCH_OPENBLAS)
  return {1, 2};
#else
  return {1};
#endif
}

void shape_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"", "E", "threads"});  // an empty name prints the bare value: BM_linear/128/E:512/threads:1
  b->ArgsProduct({{128, 512, 1024, 2048, 4096}, {512, 1024}, thread_counts()});
  b->MeasureProcessCPUTime()->Unit(benchmark::kMillisecond);
}

BENCHMARK(BM_linear)->Apply(shape_args);
BENCHMARK(BM_linear_backward)->Apply(shape_args);
BENCHMARK(BM_qkv_projection)->Apply(shape_args);
BENCHMARK(BM_mha_forward)->Apply(shape_args);
BENCHMARK(BM_mha_forward_backward)->Apply(shape_args);

}  // namespace
