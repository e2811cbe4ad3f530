// fused_bench.cpp — the fused attention kernel against the reference kernel and against the bare Eigen GEMMs of
// the same shapes (the roofline a GEMM-based attention cannot beat), forward and backward, plus the machine's
// FMA peak and the multi-head module end to end. Results and commands: docs/performance.md, bench/README.md.
//
// Shapes: float, B = 1, self-attention Lq = Lk = N, H = 8 heads up to N = 4096 and H = 1 above (N = 16384 with
// 8 heads is 0.55 TFLOP per forward), D = Dv in {64, 128}.
//   BM_fused_forward/N/D:d/causal:c/threads:t      sdpa_forward (fused kernel: opts.kernel = automatic)
//   BM_reference_forward/N/D:d/causal:c/threads:t  the same with opts.kernel = Kernel::reference (N <= 4096)
//   BM_fused_forward_bf16/N/D:d/causal:c/threads:t sdpa_forward on bfloat16 q, k, v (N <= 4096): both products on
//                                                  the BF16 dot-product instruction where the run-time dispatch
//                                                  chooses it (docs/dispatch.md), else float arithmetic on the
//                                                  widened inputs; out rounded to bfloat16
//   BM_fused_forward_into, _into_bf16              sdpa_forward_into on float / bfloat16 inputs with one workspace
//                                                  and output kept across calls: no allocation in the timed loop
//   BM_eigen_forward_gemms/N/D:d/threads:t         per head S = Q K^T, O = S V with Eigen, nothing else
//   BM_fused_backward, BM_reference_backward       sdpa_backward (given the forward's out and lse)
//   BM_fused_forward_softcap, _backward_softcap    the fused kernels with opts.softcap = 50 (Gemma 2's): the cost of
//                                                  the tanh per score (N <= 4096)
//   BM_eigen_backward_gemms/N/D:d/threads:t        per head the five GEMMs of the backward: S = Q K^T, dP = dO V^T,
//                                                  dV = P^T dO, dQ = dS K, dK = dS^T Q
//   BM_fma_peak                                    independent FMAs in registers: the core's peak FLOP/s
//   BM_bf16_dot_peak                               independent vdpbf16ps in registers (in a build whose target has
//                                                  them: -march=native on a CPU with avx512_bf16)
//   BM_mha_forward_backward/N                      MultiHeadAttention<float> forward + backward, E = 512, H = 8
// threads:t is 1, or 1 and 2 when built with OpenMP (SELFATTN_OPENMP=ON): omp_set_num_threads(t) before the run.
//
// Counters (per iteration, as rates):
//   FLOP/s         nominal FLOPs per second of CPU time of the whole process (all threads): forward 4 B H N^2 D
//                  (two GEMMs of N^2 D multiply-adds), backward 2.5 times that (five such GEMMs). Causal runs are
//                  credited with the full square, so their FLOP/s compares directly with the non-causal ones.
//                  With 2 threads this is the rate per core.
//   useful_FLOP/s  causal runs credited only with the visible half, 4 B H D N (N + 1) / 2: how close the kernel
//                  gets to the peak on the work that exists. Equal to FLOP/s without a causal mask.
//   wall_FLOP/s    nominal FLOPs per second of wall time: what a caller waits for (2 threads: both cores).
// N appears bare (BM_fused_forward/128/D:64/...) so that the ctest smoke filter /128(/|$) picks the small cases.

// g++ 12 with -march=native on AVX-512 reports "'__Y' is used uninitialized" inside its own avx512fintrin.h when
// Eigen's packet functions (pexp, pmax, ...) are inlined (GCC bug 105593, a false positive that -isystem does not
// silence). It must be switched off before Eigen is first included to take effect.
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <benchmark/benchmark.h>

#include <selfattn/detail/kernels.hpp>
#include <selfattn/selfattn.hpp>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

using namespace selfattn;

namespace {

constexpr Index kBatch = 1;

Index heads_for(Index n) { return n <= 4096 ? 8 : 1; }

// Nominal FLOPs of one forward: two GEMMs of N^2 D multiply-adds per (batch, head).
double forward_flops(Index n, Index d) {
  const double len = static_cast<double>(n);
  return 4.0 * static_cast<double>(kBatch * heads_for(n)) * len * len * static_cast<double>(d);
}
// The visible part under a causal mask: N (N + 1) / 2 of the N^2 scores.
double causal_fraction(Index n, bool causal) {
  return causal ? (static_cast<double>(n) + 1.0) / (2.0 * static_cast<double>(n)) : 1.0;
}

template <int Rank>
void fill(Tensor<float, Rank>& x, double phase) {
  for (Index i = 0; i < x.size(); ++i) x.data()[i] = static_cast<float>(std::sin(0.37 * static_cast<double>(i) + phase));
}

void set_threads(int threads) {
#ifdef _OPENMP
  omp_set_num_threads(threads);
#endif
  Eigen::setNbThreads(threads);  // Eigen's own GEMM threads (only under OpenMP)
}

// Runs `body` in the benchmark loop and sets the three FLOP counters.
template <typename Body>
void timed(benchmark::State& state, double flops, double useful_fraction, Body&& body) {
  const auto start = std::chrono::steady_clock::now();
  for (auto _ : state) body();
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  state.counters["FLOP/s"] = benchmark::Counter(flops, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["useful_FLOP/s"] =
      benchmark::Counter(flops * useful_fraction, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["wall_FLOP/s"] = benchmark::Counter(flops * static_cast<double>(state.iterations()) / wall);
}

struct Inputs {
  Tensor<float, 4> q, k, v, dout;
  explicit Inputs(Index n, Index d) : q({kBatch, heads_for(n), n, d}), k(q.shape()), v(q.shape()), dout(q.shape()) {
    fill(q, 0.1);
    fill(k, 0.2);
    fill(v, 0.3);
    fill(dout, 0.4);
  }
};

// The cap of the _softcap benchmarks: Gemma 2's 50 for its attention logits.
constexpr float kSoftcap = 50.0f;

// Arguments: N (bare), D, causal, threads.
void attention_forward(benchmark::State& state, Kernel kernel, float softcap = 0.0f) {
  const Index n = state.range(0), d = state.range(1);
  const bool causal = state.range(2) != 0;
  set_threads(static_cast<int>(state.range(3)));
  const Inputs x(n, d);
  AttentionOptions<float> opts;
  opts.causal = causal ? Causal::top_left : Causal::none;
  opts.kernel = kernel;
  opts.softcap = softcap;
  timed(state, forward_flops(n, d), causal_fraction(n, causal), [&] {
    AttentionForward<float> fwd = sdpa_forward(x.q, x.k, x.v, opts);
    float* out = fwd.out.data();
    benchmark::DoNotOptimize(out);
    benchmark::ClobberMemory();
  });
}

void attention_backward(benchmark::State& state, Kernel kernel, float softcap = 0.0f) {
  const Index n = state.range(0), d = state.range(1);
  const bool causal = state.range(2) != 0;
  set_threads(static_cast<int>(state.range(3)));
  const Inputs x(n, d);
  AttentionOptions<float> opts;
  opts.causal = causal ? Causal::top_left : Causal::none;
  opts.kernel = kernel;
  opts.softcap = softcap;
  const AttentionForward<float> fwd = sdpa_forward(x.q, x.k, x.v, opts);
  timed(state, 2.5 * forward_flops(n, d), causal_fraction(n, causal), [&] {
    AttentionGradients<float> g = sdpa_backward(x.q, x.k, x.v, fwd.out, fwd.lse, x.dout, opts);
    float* dq = g.dq.data();
    benchmark::DoNotOptimize(dq);
    benchmark::ClobberMemory();
  });
}

// attention_forward on inputs stored as S (float or bfloat16; the same values rounded, the same nominal FLOPs):
// sdpa_forward, or with `into` sdpa_forward_into with one workspace and one output kept across calls, the kernel
// without the allocation of its results and scratch. An allocating call of N = 4096, H = 8 takes 8 MiB of new memory
// for a float out and about 28 MiB on bfloat16 inputs (the widened q, the float out before rounding, K and V packed
// into pairs, the bfloat16 out); where fresh pages are slow (this VM: up to 16 us per 4 KiB page on first touch)
// that cost lands in BM_fused_forward_bf16 more than in BM_fused_forward and swings from run to run.
template <typename S>
void attention_forward_stored(benchmark::State& state, bool into) {
  const Index n = state.range(0), d = state.range(1);
  const bool causal = state.range(2) != 0;
  set_threads(static_cast<int>(state.range(3)));
  const Inputs x(n, d);
  const Tensor<S, 4> q = tensor_cast<S>(x.q), k = tensor_cast<S>(x.k), v = tensor_cast<S>(x.v);
  AttentionOptions<float> opts;
  opts.causal = causal ? Causal::top_left : Causal::none;
  Tensor<S, 4> out(into ? q.shape() : std::array<Index, 4>{});
  Tensor<float, 3> lse(into ? std::array<Index, 3>{q.dim(0), q.dim(1), q.dim(2)} : std::array<Index, 3>{});
  AttentionWorkspace<float> workspace;
  const auto run = [&] {
    if (into) {
      sdpa_forward_into(q, k, v, out.view(), lse.view(), opts, workspace);
      benchmark::DoNotOptimize(out.data());
    } else {
      AttentionForward<S> fwd = sdpa_forward(q, k, v, opts);
      benchmark::DoNotOptimize(fwd.out.data());
    }
    benchmark::ClobberMemory();
  };
  if (into) run();  // the workspace's first (allocating) call, untimed
  timed(state, forward_flops(n, d), causal_fraction(n, causal), run);
}

void BM_fused_forward(benchmark::State& state) { attention_forward(state, Kernel::automatic); }
void BM_fused_forward_bf16(benchmark::State& state) { attention_forward_stored<bfloat16>(state, false); }
void BM_fused_forward_into(benchmark::State& state) { attention_forward_stored<float>(state, true); }
void BM_fused_forward_into_bf16(benchmark::State& state) { attention_forward_stored<bfloat16>(state, true); }
void BM_reference_forward(benchmark::State& state) { attention_forward(state, Kernel::reference); }
void BM_fused_backward(benchmark::State& state) { attention_backward(state, Kernel::automatic); }
void BM_fused_forward_softcap(benchmark::State& state) { attention_forward(state, Kernel::automatic, kSoftcap); }
void BM_fused_backward_softcap(benchmark::State& state) { attention_backward(state, Kernel::automatic, kSoftcap); }
void BM_reference_backward(benchmark::State& state) { attention_backward(state, Kernel::reference); }

// The forward's two GEMMs per head with Eigen, into preallocated buffers: no scale, mask or softmax.
void BM_eigen_forward_gemms(benchmark::State& state) {
  const Index n = state.range(0), d = state.range(1);
  set_threads(static_cast<int>(state.range(2)));
  Inputs x(n, d);
  Tensor<float, 4> o(x.q.shape());
  RowMajorMatrix<float> s(n, n);
  timed(state, forward_flops(n, d), 1.0, [&] {
    for (Index b = 0; b < kBatch; ++b)
      for (Index h = 0; h < heads_for(n); ++h) {
        s.noalias() = as_matrix(x.q[b][h]) * as_matrix(x.k[b][h]).transpose();  // S = Q K^T (N x D . D x N)
        as_matrix(o[b][h]).noalias() = s * as_matrix(x.v[b][h]);                // O = S V   (N x N . N x D)
      }
    float* out = o.data();
    benchmark::DoNotOptimize(out);
    benchmark::ClobberMemory();
  });
}

// The backward's five GEMMs per head with Eigen (the elementwise softmax backward left out).
void BM_eigen_backward_gemms(benchmark::State& state) {
  const Index n = state.range(0), d = state.range(1);
  set_threads(static_cast<int>(state.range(2)));
  Inputs x(n, d);
  Tensor<float, 4> dq(x.q.shape()), dk(x.q.shape()), dv(x.q.shape());
  RowMajorMatrix<float> s(n, n), dp(n, n);
  timed(state, 2.5 * forward_flops(n, d), 1.0, [&] {
    for (Index b = 0; b < kBatch; ++b)
      for (Index h = 0; h < heads_for(n); ++h) {
        const auto q = as_matrix(x.q[b][h]), k = as_matrix(x.k[b][h]), v = as_matrix(x.v[b][h]);
        const auto dout = as_matrix(x.dout[b][h]);
        s.noalias() = q * k.transpose();                            // S = Q K^T     (P in its place)
        dp.noalias() = dout * v.transpose();                        // dP = dO V^T   (dS in its place)
        as_matrix(dv[b][h]).noalias() = s.transpose() * dout;       // dV = P^T dO
        as_matrix(dq[b][h]).noalias() = dp * k;                     // dQ = dS K
        as_matrix(dk[b][h]).noalias() = dp.transpose() * q;         // dK = dS^T Q
      }
    float* out = dq.data();
    benchmark::DoNotOptimize(out);
    benchmark::ClobberMemory();
  });
}

// The peak: 12 independent chains of packet FMAs (Eigen's pmadd, the instruction the micro-kernels use), long
// enough that loop overhead and latency vanish: 2 FLOPs per lane per FMA.
void BM_fma_peak(benchmark::State& state) {
  using P = detail::micro::Packet<float>;
  constexpr Index lanes = detail::micro::packet_size<float>;
  constexpr int chains = 12;
  constexpr Index steps = 1 << 16;
  volatile float seed_a = 0.999999f, seed_b = 1e-7f;  // not constants the compiler could fold
  const P a = Eigen::internal::pset1<P>(static_cast<float>(seed_a));
  const P b = Eigen::internal::pset1<P>(static_cast<float>(seed_b));
  P acc[chains];
  detail::micro::unroll<chains>([&](auto c) { acc[c] = Eigen::internal::pset1<P>(static_cast<float>(c)); });
  timed(state, 2.0 * chains * lanes * steps, 1.0, [&] {
    for (Index step = 0; step < steps; ++step)
      detail::micro::unroll<chains>([&](auto c) { acc[c] = Eigen::internal::pmadd(acc[c], a, b); });
    benchmark::DoNotOptimize(acc);
  });
}

#if defined(__AVX512BF16__)
// The BF16 dot-product instruction's peak: independent vdpbf16ps in registers, each 16 lanes x 2 multiply-adds.
void BM_bf16_dot_peak(benchmark::State& state) {
  constexpr int chains = 12;
  constexpr Index steps = 1 << 16;
  volatile std::uint32_t seed = 0x3F7F3F7Fu;  // the pair (0.996, 0.996), not a constant the compiler could fold
  const __m512bh a = (__m512bh)_mm512_set1_epi32(static_cast<int>(seed));
  const __m512bh b = (__m512bh)_mm512_set1_epi32(static_cast<int>(seed) ^ 0x00010001);
  __m512 acc[chains];
  detail::micro::unroll<chains>([&](auto c) { acc[c] = _mm512_set1_ps(static_cast<float>(c)); });
  timed(state, 4.0 * chains * 16 * steps, 1.0, [&] {
    for (Index step = 0; step < steps; ++step)
      detail::micro::unroll<chains>([&](auto c) { acc[c] = _mm512_dpbf16_ps(acc[c], a, b); });
    benchmark::DoNotOptimize(acc);
  });
}
#endif

void BM_mha_forward_backward(benchmark::State& state) {
  const Index n = state.range(0);
  set_threads(static_cast<int>(state.range(1)));
  MultiHeadAttentionConfig cfg;
  cfg.embed_dim = 512;
  cfg.num_heads = 8;
  const MultiHeadAttention<float> mha(cfg);
  Tensor<float, 3> x({kBatch, n, cfg.embed_dim}), dy(x.shape());
  fill(x, 0.5);
  fill(dy, 0.6);
  // attention (forward + backward, 3.5 x 4 B H N^2 Dh) + 4 projections (forward 2 B N E^2 each, backward twice that)
  const double len = static_cast<double>(n), e = static_cast<double>(cfg.embed_dim);
  const double flops = 3.5 * 4.0 * kBatch * 8 * len * len * 64 + 3.0 * 4.0 * 2.0 * kBatch * len * e * e;
  timed(state, flops, 1.0, [&] {
    const MhaForward<float> fwd = mha.forward(x);
    const MhaGradients<float> g = mha.backward(dy, fwd);
    const float* out = g.d_query.data();
    benchmark::DoNotOptimize(out);
    benchmark::ClobberMemory();
  });
}

std::vector<int64_t> thread_counts() {
#ifdef _OPENMP
  return {1, 2};
#else
  return {1};
#endif
}

const std::vector<int64_t> sizes = {128, 256, 512, 1024, 2048, 4096, 8192, 16384};

void attention_args(benchmark::internal::Benchmark* b, int64_t max_n) {
  b->ArgNames({"", "D", "causal", "threads"});  // an empty name prints the bare value: .../128/D:64/...
  for (int64_t n : sizes)
    for (int64_t d : {64, 128})
      for (int64_t causal : {0, 1})
        for (int64_t threads : thread_counts())
          if (n <= max_n) b->Args({n, d, causal, threads});
  b->MeasureProcessCPUTime()->Unit(benchmark::kMillisecond);
}

void gemm_args(benchmark::internal::Benchmark* b, int64_t max_n) {
  b->ArgNames({"", "D", "threads"});
  for (int64_t n : sizes)
    for (int64_t d : {64, 128})
      for (int64_t threads : thread_counts())
        if (n <= max_n) b->Args({n, d, threads});
  b->MeasureProcessCPUTime()->Unit(benchmark::kMillisecond);
}

BENCHMARK(BM_fma_peak)->MeasureProcessCPUTime();
#if defined(__AVX512BF16__)
BENCHMARK(BM_bf16_dot_peak)->MeasureProcessCPUTime();
#endif
BENCHMARK(BM_fused_forward)->Apply([](auto* b) { attention_args(b, 16384); });
BENCHMARK(BM_reference_forward)->Apply([](auto* b) { attention_args(b, 4096); });  // holds N^2 scores per head
BENCHMARK(BM_fused_forward_softcap)->Apply([](auto* b) { attention_args(b, 4096); });
BENCHMARK(BM_fused_forward_bf16)->Apply([](auto* b) { attention_args(b, 4096); });
BENCHMARK(BM_fused_forward_into)->Apply([](auto* b) { attention_args(b, 4096); });
BENCHMARK(BM_fused_forward_into_bf16)->Apply([](auto* b) { attention_args(b, 4096); });
BENCHMARK(BM_eigen_forward_gemms)->Apply([](auto* b) { gemm_args(b, 16384); });  // S: N^2 floats (1 GB at 16384)
BENCHMARK(BM_fused_backward)->Apply([](auto* b) { attention_args(b, 16384); });
BENCHMARK(BM_reference_backward)->Apply([](auto* b) { attention_args(b, 4096); });
BENCHMARK(BM_fused_backward_softcap)->Apply([](auto* b) { attention_args(b, 4096); });
BENCHMARK(BM_eigen_backward_gemms)->Apply([](auto* b) { gemm_args(b, 16384); });
BENCHMARK(BM_mha_forward_backward)
    ->ArgNames({"", "threads"})
    ->ArgsProduct({{128, 512, 2048}, thread_counts()})
    ->MeasureProcessCPUTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
