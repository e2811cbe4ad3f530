// layer_bench.cpp — the transformer layer end to end, its parts one by one, and Eigen's GEMM on the FFN's shapes as
// the baseline, in one run. Results and commands: docs/performance.md ("The transformer layer").
//
// Shapes: float, B = 1, x (B, N, E), E = 512, H = 8 (head dim 64), F = 2048, N in {128, 512, 2048}; PyTorch's default
// layer (post-norm, ReLU, biases), in inference mode (no dropout).
//   BM_layer_forward/N/threads:t            TransformerLayer<float>::forward(x)
//   BM_layer_forward_backward/N/threads:t   forward then backward (all input and parameter gradients)
//   BM_layer_parts/N/threads:t              the forward's walk run part by part with the library's public pieces, each
//                                           part timed: counters attention, projections, ffn, norms = share of time
//   BM_layer_parts_backward/N/threads:t     the same for forward + backward
//   BM_eigen_gemm_ffn/N/threads:t           the baseline: Eigen's GEMMs of the FFN's two shapes, (N, E) x (F, E)^T and
//                                           (N, F) x (E, F)^T
// threads:t sets omp_set_num_threads(t) and Eigen::setNbThreads(t).
//
// FLOPs counted (multiply-add = 2): projections 8 N E^2 (Q, K, V, out), FFN 4 N E F, attention 4 N^2 E (QK^T and
// PV); the backward counts 2x the projections and FFN (dX and dW) and 2.5x the attention (the fused backward
// recomputes QK^T). Norms, activations and residuals are not counted. Counters: FLOP/s per second of process CPU
// time (all threads) and wall_FLOP/s per second of wall time.
// N appears bare (BM_layer_forward/128/threads:1) so that the ctest smoke filter /128(/|$) picks the small case.

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
#include <map>
#include <string>
#include <type_traits>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

using namespace selfattn;

namespace {

constexpr Index kEmbed = 512, kHeads = 8, kFfn = 2048;

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
}

TransformerLayerConfig layer_config() {
  TransformerLayerConfig cfg;
  cfg.attention.embed_dim = kEmbed;
  cfg.attention.num_heads = kHeads;
  cfg.ffn_dim = kFfn;
  return cfg;  // post-norm, ReLU, dropout only in training mode (off here)
}

struct Flops {
  double projections, ffn, attention;
  explicit Flops(Index n) {
    const double rows = static_cast<double>(n), e = kEmbed, f = kFfn;
    projections = 8.0 * rows * e * e;
    ffn = 4.0 * rows * e * f;
    attention = 4.0 * rows * rows * e;
  }
  double forward() const { return projections + ffn + attention; }
  double forward_backward() const { return 3.0 * (projections + ffn) + 3.5 * attention; }
};

// Runs `body` in the benchmark loop and sets the FLOP counters (CPU time and wall time).
template <typename Body>
void timed(benchmark::State& state, double flops, Body&& body) {
  const auto start = std::chrono::steady_clock::now();
  for (auto _ : state) body();
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  state.counters["FLOP/s"] = benchmark::Counter(flops, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["wall_FLOP/s"] = benchmark::Counter(flops * static_cast<double>(state.iterations()) / wall);
}

template <typename T>
void keep(const T* p) {
  benchmark::DoNotOptimize(p);
  benchmark::ClobberMemory();
}

struct Inputs {
  Index n;
  Tensor<float, 3> x, dy;
  explicit Inputs(benchmark::State& state) : n(state.range(0)), x({1, n, kEmbed}), dy({1, n, kEmbed}) {
    set_threads(static_cast<int>(state.range(1)));
    fill(x, 0.5);
    fill(dy, 0.6, 0.01);
  }
};

void BM_layer_forward(benchmark::State& state) {
  const Inputs in(state);
  const TransformerLayer<float> layer(layer_config());
  timed(state, Flops(in.n).forward(), [&] { keep(layer.forward(in.x).output.data()); });
}

void BM_layer_forward_backward(benchmark::State& state) {
  const Inputs in(state);
  const TransformerLayer<float> layer(layer_config());
  timed(state, Flops(in.n).forward_backward(), [&] {
    const TransformerLayerForward<float> f = layer.forward(in.x);
    keep(layer.backward(in.dy, f).d_input.data());
  });
}

// Wall-clock seconds per part, summed over the benchmark's iterations.
class PartTimer {
 public:
  template <typename F>
  auto operator()(const std::string& part, F&& f) {
    const auto start = std::chrono::steady_clock::now();
    if constexpr (std::is_void_v<std::invoke_result_t<F>>) {
      f();
      add(part, start);
    } else {
      auto result = f();
      add(part, start);
      return result;
    }
  }
  void report(benchmark::State& state) const {
    double total = 0;
    for (const auto& [part, s] : seconds_) total += s;
    for (const auto& [part, s] : seconds_) state.counters[part] = s / total;
  }

 private:
  void add(const std::string& part, std::chrono::steady_clock::time_point start) {
    seconds_[part] += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  std::map<std::string, double> seconds_;
};

// The post-norm layer's forward, part by part, with the public pieces the layer is made of:
//   qkv = x [Wq; Wk; Wv]^T + b;  o = sdpa(q, k, v);  a = merge(o) Wout^T + b  (projections, attention)
//   h = LayerNorm(x + a)                                                        (norms: residual + norm)
//   f = FeedForward(h)                                                          (ffn)
//   y = LayerNorm(h + f)                                                        (norms)
struct LayerParts {
  const TransformerLayer<float> layer{layer_config()};
  const MhaParams<float>& attn = layer.params().self_attn;
  LayerNorm<float> norm1{kEmbed}, norm2{kEmbed};
  FeedForward<float> ffn{FeedForwardConfig{kEmbed, kFfn, Activation::relu, 0.0, true}};

  struct Forward {
    Tensor<float, 3> qkv, merged, attention_out, residual1, residual2;
    AttentionForward<float> heads;
    NormForward<float> n1, n2;
    FeedForwardForward<float> f;
  };

  Forward forward(const Tensor<float, 3>& x, PartTimer& t) const {
    Forward s;
    s.qkv = t("projections", [&] {
      return detail::fused_qkv_projection<float>(x, {attn.q_weight.view(), attn.k_weight.view(), attn.v_weight.view()},
                                                 {attn.q_bias.view(), attn.k_bias.view(), attn.v_bias.view()});
    });
    const Index n = x.dim(1);
    const auto block = [&](Index column) {
      return split_heads(TensorView<const float, 3>(s.qkv.data() + column, {1, n, kEmbed}, {n * 3 * kEmbed, 3 * kEmbed, 1}),
                         kHeads);
    };
    s.heads = t("attention", [&] { return sdpa_forward(block(0), block(kEmbed), block(2 * kEmbed)); });
    s.merged = t("attention", [&] { return merge_heads(s.heads.out); });
    s.attention_out = t("projections", [&] { return linear<float>(s.merged, attn.out_weight, attn.out_bias); });
    s.residual1 = t("norms", [&] { return s.attention_out + x; });
    s.n1 = t("norms", [&] { return norm1.forward(s.residual1); });
    s.f = t("ffn", [&] { return ffn.forward(s.n1.output); });
    s.residual2 = t("norms", [&] { return s.f.output + s.n1.output; });
    s.n2 = t("norms", [&] { return norm2.forward(s.residual2); });
    return s;
  }

  void backward(const Tensor<float, 3>& x, const Tensor<float, 3>& dy, const Forward& s, PartTimer& t) const {
    const NormGradients<float> g2 = t("norms", [&] { return norm2.backward(dy, s.n2); });
    const FeedForwardGradients<float> gf = t("ffn", [&] { return ffn.backward(g2.d_input, s.f); });
    const Tensor<float, 3> dh = t("norms", [&] { return gf.d_input + g2.d_input; });
    const NormGradients<float> g1 = t("norms", [&] { return norm1.backward(dh, s.n1); });
    const LinearGradients<float> go =
        t("projections", [&] { return linear_backward<float>(s.merged, attn.out_weight, g1.d_input, true); });
    const Index n = x.dim(1);
    const auto block = [&](Index column) {
      return split_heads(TensorView<const float, 3>(s.qkv.data() + column, {1, n, kEmbed}, {n * 3 * kEmbed, 3 * kEmbed, 1}),
                         kHeads);
    };
    const AttentionGradients<float> ga = t("attention", [&] {
      return sdpa_backward(block(0), block(kEmbed), block(2 * kEmbed), s.heads.out, s.heads.lse,
                           split_heads(TensorView<const float, 3>(go.dx), kHeads));
    });
    // dqkv = [merge(dq) | merge(dk) | merge(dv)];  dx = dqkv [Wq; Wk; Wv], dW = dqkv^T x: the three projections' backward
    const Tensor<float, 3> dq = merge_heads(ga.dq), dk = merge_heads(ga.dk), dv = merge_heads(ga.dv);
    t("projections", [&] {
      const LinearGradients<float> a = linear_backward<float>(x, attn.q_weight, dq, true);
      const LinearGradients<float> b = linear_backward<float>(x, attn.k_weight, dk, true);
      const LinearGradients<float> c = linear_backward<float>(x, attn.v_weight, dv, true);
      keep(a.dx.data());
      keep(b.dx.data());
      keep(c.dx.data());
    });
  }
};

void BM_layer_parts(benchmark::State& state) {
  const Inputs in(state);
  const LayerParts parts;
  PartTimer timer;
  timed(state, Flops(in.n).forward(), [&] { keep(parts.forward(in.x, timer).n2.output.data()); });
  timer.report(state);
}

void BM_layer_parts_backward(benchmark::State& state) {
  const Inputs in(state);
  const LayerParts parts;
  PartTimer timer;
  timed(state, Flops(in.n).forward_backward(), [&] {
    const LayerParts::Forward s = parts.forward(in.x, timer);
    parts.backward(in.x, in.dy, s, timer);
  });
  timer.report(state);
}

// The baseline: Eigen's GEMMs of the FFN's two shapes, row-major like the layer's:
//   Z (N, F) = X (N, E) W1^T with W1 (F, E);   Y (N, E) = H (N, F) W2^T with W2 (E, F).
void BM_eigen_gemm_ffn(benchmark::State& state) {
  const Inputs in(state);
  RowMajorMatrix<float> x(in.n, kEmbed), w1(kFfn, kEmbed), z(in.n, kFfn), w2(kEmbed, kFfn), y(in.n, kEmbed);
  x.setRandom();
  w1.setRandom();
  w2.setRandom();
  timed(state, 4.0 * static_cast<double>(in.n) * kEmbed * kFfn, [&] {
    z.noalias() = x * w1.transpose();
    y.noalias() = z * w2.transpose();
    keep(y.data());
  });
}

std::vector<int64_t> thread_counts() {
#ifdef _OPENMP
  return {1, 2};
#else
  return {1};
#endif
}

void shape_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"", "threads"});  // an empty name prints the bare value: BM_layer_forward/128/threads:1
  b->ArgsProduct({{128, 512, 2048}, thread_counts()});
  b->MeasureProcessCPUTime()->Unit(benchmark::kMillisecond);
}

BENCHMARK(BM_eigen_gemm_ffn)->Apply(shape_args);
BENCHMARK(BM_layer_forward)->Apply(shape_args);
BENCHMARK(BM_layer_forward_backward)->Apply(shape_args);
BENCHMARK(BM_layer_parts)->Apply(shape_args);
BENCHMARK(BM_layer_parts_backward)->Apply(shape_args);

}  // namespace
