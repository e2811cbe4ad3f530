// attention_bench.cpp — how fast is the reference attention, measured against the bare GEMMs it must do.
//
// Shapes: B = 1, H = 8 heads, D = 64 head dim, float; self-attention, Lq = Lk = N for N in {128, 512, 2048}.
//   BM_sdpa_reference/N/causal:C   sdpa_forward(q, k, v) on (B, H, N, D) tensors; C = 0 no mask, C = 1 Causal::top_left
//   BM_eigen_gemm/N                the two Eigen GEMMs per head, S = Q K^T then O = S V: the roofline baseline
//   BM_mha_forward/N               MultiHeadAttention<float>::forward, E = 512, H = 8, self-attention on (B, N, E)
//
// Every benchmark reports a FLOP/s counter from a nominal FLOP count per iteration:
//   attention    4 B H N^2 D   = 2 GEMMs (Q K^T: N x D . D x N, and S V: N x N . N x D), each N^2 D multiply-adds,
//                                2 flops per multiply-add. Softmax, masking and scaling are not counted.
//                                The causal variant does about half the useful work but is credited with the
//                                full square, so its FLOP/s is directly comparable with the non-causal one.
//   projections  4 * 2 B N E^2 = the Q, K, V and output projections, (B N x E) . (E x E) each (module only).
// Benchmark names carry N as a bare "/N" so that --benchmark_filter=/128 selects the small cases.

#include <benchmark/benchmark.h>

#include <selfattn/selfattn.hpp>

#include <cmath>
#include <cstdint>

using namespace selfattn;

namespace {

constexpr Index kBatch = 1;     // B
constexpr Index kHeads = 8;     // H
constexpr Index kHeadDim = 64;  // D
constexpr Index kEmbed = 512;   // E = H * D, for the module

// 2 GEMMs (Q K^T and S V) of N^2 D multiply-adds per (batch, head), 2 flops per multiply-add.
double attention_flops(Index n) {
  const double len = static_cast<double>(n);
  return 4.0 * kBatch * kHeads * len * len * kHeadDim;
}
// 4 projections (q, k, v, out), each (B N x E) . (E x E).
double projection_flops(Index n) { return 4.0 * 2.0 * kBatch * static_cast<double>(n) * kEmbed * kEmbed; }

// Deterministic values in [-1, 1]; the pattern differs per tensor through `phase`.
template <int Rank>
void fill(Tensor<float, Rank>& x, double phase) {
  for (Index i = 0; i < x.size(); ++i)
    x.data()[i] = static_cast<float>(std::sin(0.37 * static_cast<double>(i) + phase));
}

void BM_sdpa_reference(benchmark::State& state) {
  const Index n = state.range(0);
  Tensor<float, 4> q({kBatch, kHeads, n, kHeadDim}), k(q.shape()), v(q.shape());
  fill(q, 0.1);
  fill(k, 0.2);
  fill(v, 0.3);
  AttentionOptions<float> opts;
  opts.causal = state.range(1) != 0 ? Causal::top_left : Causal::none;
  opts.kernel = Kernel::reference;  // this benchmark measures the reference kernel (the default would run the fused one)
  for (auto _ : state) {
    AttentionForward<float> fwd = sdpa_forward(q, k, v, opts);
    float* out = fwd.out.data();
    benchmark::DoNotOptimize(out);
    benchmark::ClobberMemory();
  }
  state.counters["FLOP/s"] = benchmark::Counter(attention_flops(n), benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_sdpa_reference)
    ->ArgNames({"", "causal"})  // an empty name prints the bare value: BM_sdpa_reference/128/causal:0
    ->ArgsProduct({{128, 512, 2048}, {0, 1}})
    ->Unit(benchmark::kMillisecond);

void BM_eigen_gemm(benchmark::State& state) {
  const Index n = state.range(0);
  Tensor<float, 4> q({kBatch, kHeads, n, kHeadDim}), k(q.shape()), v(q.shape()), o(q.shape());
  fill(q, 0.1);
  fill(k, 0.2);
  fill(v, 0.3);
  RowMajorMatrix<float> s(n, n);  // scores of one head, reused: no allocation in the loop
  for (auto _ : state) {
    for (Index b = 0; b < kBatch; ++b)
      for (Index h = 0; h < kHeads; ++h) {
        s.noalias() = as_matrix(q[b][h]) * as_matrix(k[b][h]).transpose();  // S = Q K^T  (N x D . D x N)
        as_matrix(o[b][h]).noalias() = s * as_matrix(v[b][h]);              // O = S V    (N x N . N x D)
      }
    float* out = o.data();
    benchmark::DoNotOptimize(out);
    benchmark::ClobberMemory();
  }
  state.counters["FLOP/s"] = benchmark::Counter(attention_flops(n), benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_eigen_gemm)->Arg(128)->Arg(512)->Arg(2048)->Unit(benchmark::kMillisecond);

void BM_mha_forward(benchmark::State& state) {
  const Index n = state.range(0);
  MultiHeadAttentionConfig cfg;
  cfg.embed_dim = kEmbed;
  cfg.num_heads = kHeads;
  const MultiHeadAttention<float> mha(cfg);
  Tensor<float, 3> x({kBatch, n, kEmbed});
  fill(x, 0.4);
  for (auto _ : state) {
    MhaForward<float> fwd = mha.forward(x);
    float* out = fwd.output.data();
    benchmark::DoNotOptimize(out);
    benchmark::ClobberMemory();
  }
  state.counters["FLOP/s"] =
      benchmark::Counter(attention_flops(n) + projection_flops(n), benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_mha_forward)->Arg(128)->Arg(512)->Arg(2048)->Unit(benchmark::kMillisecond);

}  // namespace
