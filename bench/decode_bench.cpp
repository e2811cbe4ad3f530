// Decoding benchmarks: one decode step over a KV cache, as memory bandwidth, next to a STREAM-like triad
// measured in the same binary; and decoding with the cache against recomputing attention every token.
//
//   BM_triad/N/H/Hkv          a[i] = b[i] + s c[i] over as many bytes as the decode step below reads
//   BM_decode_kernel/N/H/Hkv  one query row per head over N cached keys and values (D = 128, float):
//                             the attention of one decode step, reported as GB/s of K/V read
//   BM_decode_general/N/H/Hkv the same with the general path forced (two GEMMs per chunk), for comparison
//   BM_decode_softcap/N/H/Hkv BM_decode_kernel with opts.softcap = 50: the general path and a tanh per score
//   BM_decode_kernel_bf16, _f16  BM_decode_kernel with K and V stored as bfloat16 / float16 (half the bytes; the
//                             GB/s count the 16-bit bytes actually read)
//   BM_decode_kernel_int8     BM_decode_kernel with K and V stored as int8 and a bfloat16 scale per block of 32
//                             (quantize_int8; the GB/s count the int8 values and the scales)
//   BM_decode_kernel_paired_int8  the float, bfloat16 and int8 steps in rotation in one loop, each timed: their
//                             tokens/s and the ratios int8/bf16, int8/float from the same minutes
//   BM_decode_step/N          MultiHeadAttention::step of one token over a cache of N tokens (E = 1024)
//   BM_decode_step_bf16/N     the same over a bfloat16 cache (tokens/s: the figure to compare with the float cache)
//   BM_decode_step_bf16_weights/N  the same with bfloat16 projection weights too (step_into_with, params_cast)
//   BM_decode_step_paired_bf16/N   the float and the bfloat16 cache stepped in alternation in one loop, each step
//                             timed: float_tokens/s, half_tokens/s and their ratio from the same minutes
//   BM_stack_step/N           one token through a 4-layer decoder (E = 1024, F = 4096) over caches of N tokens
//   BM_stack_step_bf16/N      the same with bfloat16 caches and bfloat16 weights (TransformerStack::step_with)
//   BM_recompute/N            the same token by a full causal forward over all N tokens (no cache)
//
// The figure of merit is BM_decode_kernel's bytes_per_second over BM_triad's for the same N/H/Hkv.
// Threads: with OpenMP (-DSELFATTN_OPENMP=ON) the last argument picks the thread count (1 or 2).
#include <benchmark/benchmark.h>

#include <selfattn/selfattn.hpp>

#include <chrono>
#include <cmath>
#include <optional>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace {

using selfattn::Index;
using selfattn::Tensor;

constexpr Index head_dim = 128;

void use_threads(benchmark::State& state, int argument) {
  const int threads = static_cast<int>(state.range(argument));
#ifdef _OPENMP
  omp_set_num_threads(threads);
#else
  if (threads != 1) state.SkipWithError("built without OpenMP: one thread only");
#endif
}

// Runs `step` twice untimed before the timed loop. The first pass over freshly allocated megabytes can be far slower
// than the steady state on a virtual machine (measured here: about 300 ms instead of 10 for the first read of a 256 MiB
// float cache written just before, with no page faults counted in the guest), and Google Benchmark 1.7 has no
// warm-up option: it would time that first pass inside every run whose setup allocates anew.
template <typename Step>
void warm_up(const Step& step) {
  for (int pass = 0; pass < 2; ++pass) step();
}

template <int Rank>
Tensor<float, Rank> filled(const std::array<Index, Rank>& shape) {
  Tensor<float, Rank> t(shape);
  for (Index n = 0; n < t.size(); ++n) t.data()[n] = static_cast<float>(std::sin(0.001 * static_cast<double>(n)));
  return t;
}

// Bytes of K and V one decode step reads: 2 Hkv N D elements of `element_bytes` (4: float).
double kv_bytes(Index keys, Index kv_heads, double element_bytes = sizeof(float)) {
  return 2.0 * static_cast<double>(kv_heads * keys * head_dim) * element_bytes;
}

void BM_triad(benchmark::State& state) {
  use_threads(state, 3);
  // Three arrays whose traffic (2 reads + 1 write) equals the decode step's K/V read.
  const auto n = static_cast<std::ptrdiff_t>(kv_bytes(state.range(0), state.range(2)) / (3 * sizeof(float)));
  std::vector<float> a(static_cast<std::size_t>(n)), b(static_cast<std::size_t>(n), 1.0f), c(static_cast<std::size_t>(n), 2.0f);
  const float s = 3.0f;
  const auto run = [&] {
#ifdef _OPENMP
#pragma omp parallel for schedule(static)
#endif
    for (std::ptrdiff_t i = 0; i < n; ++i) a[static_cast<std::size_t>(i)] = b[static_cast<std::size_t>(i)] + s * c[static_cast<std::size_t>(i)];
  };
  warm_up(run);
  for (auto _ : state) {
    run();
    benchmark::DoNotOptimize(a.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * 3 * n * static_cast<int64_t>(sizeof(float)));
}

// One decode step through detail::decode_forward on the given path (the rule's choice when `forced` is empty), with
// keys and values stored as S (float, or 16 bits read in place).
template <typename S = float>
void decode_kernel(benchmark::State& state, std::optional<selfattn::detail::DecodePath> forced, float softcap = 0.0f) {
  use_threads(state, 3);
  const Index keys = state.range(0), heads = state.range(1), kv_heads = state.range(2);
  const auto q = filled<4>({1, heads, 1, head_dim});
  const auto k = selfattn::tensor_cast<S>(filled<4>({1, kv_heads, keys, head_dim}));
  const auto v = selfattn::tensor_cast<S>(filled<4>({1, kv_heads, keys, head_dim}));
  selfattn::AttentionOptions<float> opts;
  opts.softcap = softcap;
  const auto params = selfattn::detail::make_stored_params<float, S>(q, k, v, opts);
  const selfattn::detail::DecodePath path = forced ? *forced : selfattn::detail::decode_path(params);
  Tensor<float, 4> out({1, heads, 1, head_dim});
  Tensor<float, 3> lse({1, heads, 1});
  const auto run = [&] {
    selfattn::detail::decode_forward(params, selfattn::detail::ForwardOutputs<float>{out.view(), lse.view(), {}}, path);
  };
  warm_up(run);
  for (auto _ : state) {
    run();
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(
      static_cast<int64_t>(static_cast<double>(state.iterations()) * kv_bytes(keys, kv_heads, sizeof(S))));
  // 4 flops per key and dimension per query head: q.k and p v, a multiply and an add each.
  state.counters["FLOP/s"] = benchmark::Counter(4.0 * static_cast<double>(heads * keys * head_dim),
                                                benchmark::Counter::kIsIterationInvariantRate);
}

// The path decode_path picks (the streaming path for up to 3 rows per key/value head, else the grouped path).
void BM_decode_kernel(benchmark::State& state) { decode_kernel(state, std::nullopt); }
// The general path forced (Eigen products per chunk): what BM_decode_kernel improves on.
void BM_decode_general(benchmark::State& state) { decode_kernel(state, selfattn::detail::DecodePath::general); }
// With opts.softcap = 50 (Gemma 2's): the rule then picks the general path, which caps each chunk's scores.
void BM_decode_softcap(benchmark::State& state) { decode_kernel(state, std::nullopt, 50.0f); }
// The path decode_path picks, over keys and values stored in 16 bits.
void BM_decode_kernel_bf16(benchmark::State& state) { decode_kernel<selfattn::bfloat16>(state, std::nullopt); }
void BM_decode_kernel_f16(benchmark::State& state) { decode_kernel<selfattn::float16>(state, std::nullopt); }

// Keys and values stored as int8 with a bfloat16 scale per block of 32 (quantize_int8), the rule's path.
struct Int8Step {
  Tensor<float, 4> q;
  mutable Tensor<float, 4> out;  // the step writes its results; warm_up takes the step as const
  mutable Tensor<float, 3> lse;
  selfattn::QuantizedTensor k, v;
  selfattn::AttentionOptions<float> opts;
  selfattn::detail::AttentionParams<float, std::int8_t> params;

  Int8Step(Index keys, Index heads, Index kv_heads)
      : q(filled<4>({1, heads, 1, head_dim})),
        out({1, heads, 1, head_dim}),
        lse({1, heads, 1}),
        k(selfattn::quantize_int8(filled<4>({1, kv_heads, keys, head_dim}))),
        v(selfattn::quantize_int8(filled<4>({1, kv_heads, keys, head_dim}))),
        params(selfattn::detail::make_stored_params<float, std::int8_t>(q, k.values, v.values, opts)) {
    params.k_scales = k.scales;
    params.v_scales = v.scales;
  }
  void operator()() const {
    selfattn::detail::decode_forward(params, selfattn::detail::ForwardOutputs<float>{out.view(), lse.view(), {}});
  }
};

// Bytes of K and V one int8 decode step reads: the int8 values and their bfloat16 scales.
double int8_kv_bytes(Index keys, Index kv_heads) {
  return kv_bytes(keys, kv_heads, 1.0) +
         2.0 * static_cast<double>(kv_heads * keys * selfattn::int8_blocks(head_dim)) * 2.0;
}

void BM_decode_kernel_int8(benchmark::State& state) {
  use_threads(state, 3);
  const Index keys = state.range(0);
  Int8Step step(keys, state.range(1), state.range(2));
  warm_up(step);
  for (auto _ : state) {
    step();
    benchmark::DoNotOptimize(step.out.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(
      static_cast<int64_t>(static_cast<double>(state.iterations()) * int8_kv_bytes(keys, state.range(2))));
  state.counters["FLOP/s"] = benchmark::Counter(4.0 * static_cast<double>(state.range(1) * keys * head_dim),
                                                benchmark::Counter::kIsIterationInvariantRate);
}

// The decode step of BM_decode_kernel over a float, a bfloat16 and an int8 cache in rotation within one loop, each
// step timed: the steps per second of each (a step is one token) and the int8 cache's ratios to the two others,
// all from the same minutes (absolute times drift by 20-50 % between runs on a shared machine).
void BM_decode_kernel_paired_int8(benchmark::State& state) {
  using clock = std::chrono::steady_clock;
  use_threads(state, 3);
  const Index keys = state.range(0), heads = state.range(1), kv_heads = state.range(2);
  const auto q = filled<4>({1, heads, 1, head_dim});
  const auto k = filled<4>({1, kv_heads, keys, head_dim}), v = filled<4>({1, kv_heads, keys, head_dim});
  const auto k16 = selfattn::tensor_cast<selfattn::bfloat16>(k), v16 = selfattn::tensor_cast<selfattn::bfloat16>(v);
  const selfattn::AttentionOptions<float> opts;
  const auto float_params = selfattn::detail::make_params<float>(q, k, v, opts);
  const auto half_params = selfattn::detail::make_stored_params<float, selfattn::bfloat16>(q, k16, v16, opts);
  Int8Step int8(keys, heads, kv_heads);
  Tensor<float, 4> out({1, heads, 1, head_dim});
  Tensor<float, 3> lse({1, heads, 1});
  const selfattn::detail::ForwardOutputs<float> outputs{out.view(), lse.view(), {}};
  const auto run_float = [&] { selfattn::detail::decode_forward(float_params, outputs); };
  const auto run_half = [&] { selfattn::detail::decode_forward(half_params, outputs); };
  warm_up(run_float);
  warm_up(run_half);
  warm_up(int8);
  const auto timed = [](const auto& step) {
    const clock::time_point start = clock::now();
    step();
    benchmark::ClobberMemory();
    return std::chrono::duration<double>(clock::now() - start).count();
  };
  double seconds[3] = {0.0, 0.0, 0.0};
  int turn = 0;
  for (auto _ : state) {
    for (int i = 0; i < 3; ++i) {  // the order rotates, so that none always runs after the same one
      const int which = (turn + i) % 3;
      seconds[which] += which == 0 ? timed(run_float) : which == 1 ? timed(run_half) : timed([&] { int8(); });
    }
    turn = (turn + 1) % 3;
  }
  const auto steps = static_cast<double>(state.iterations());
  state.counters["float_tokens/s"] = steps / seconds[0];
  state.counters["bf16_tokens/s"] = steps / seconds[1];
  state.counters["int8_tokens/s"] = steps / seconds[2];
  state.counters["int8/bf16"] = seconds[1] / seconds[2];
  state.counters["int8/float"] = seconds[0] / seconds[2];
}

selfattn::MultiHeadAttention<float> decoder(Index heads, Index kv_heads) {
  selfattn::MultiHeadAttentionConfig cfg;
  cfg.embed_dim = heads * head_dim;
  cfg.num_heads = heads;
  cfg.num_kv_heads = kv_heads;
  cfg.rope_dim = head_dim;
  return selfattn::MultiHeadAttention<float>(cfg, 1);
}

// One token through the module (projections, RoPE, append, attention) over a cache of `keys` tokens stored as S,
// which is truncated back to `keys` after each step (so every step reads keys + 1 keys and values, and the cache holds
// keys + 1 slots). step_into: the cache's buffers, no allocation per token. W: the storage type of the projections'
// parameters (float: params(); 16-bit: params_cast of them, through step_into_with).
template <typename S, typename W = float>
struct DecodeStepSetup {
  Index keys;
  selfattn::MultiHeadAttention<float> mha = decoder(8, 8);
  selfattn::MhaParams<W> weights = selfattn::params_cast<W>(mha.params());
  selfattn::KVCache<float, S> cache = mha.template make_cache<S>(1, selfattn::CachePolicy::keep_all(keys + 1));
  Tensor<float, 3> token = filled<3>({1, 1, 8 * head_dim});
  Tensor<float, 3> output = Tensor<float, 3>({1, 1, 8 * head_dim});

  explicit DecodeStepSetup(Index cached_keys) : keys(cached_keys) {
    // Keys and values appended directly: a prefill through step would cost O(N^2) per repetition and read the same.
    const Index chunk = 1024;
    for (Index filled_keys = 0; filled_keys < keys; filled_keys += chunk) {
      const auto rows = filled<3>({8, std::min(chunk, keys - filled_keys), head_dim});
      cache.append(0, rows, rows);
    }
  }

  void step() {
    mha.step_into_with(weights, token, cache, output.view());
    cache.truncate(0, keys);
  }
};

template <typename S = float, typename W = float>
void decode_step(benchmark::State& state) {
  use_threads(state, 1);
  DecodeStepSetup<S, W> setup(state.range(0));
  const auto run = [&] { setup.step(); };
  warm_up(run);
  for (auto _ : state) {
    run();
    benchmark::DoNotOptimize(setup.output.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(
      static_cast<int64_t>(static_cast<double>(state.iterations()) * kv_bytes(setup.keys, 8, sizeof(S))));
  state.counters["tokens/s"] = benchmark::Counter(1.0, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["cache_MiB"] = static_cast<double>(setup.cache.memory_bytes()) / (1024.0 * 1024.0);
}

// The float and the 16-bit cache (S) stepped in alternation in one timed loop, each step timed on its own: the ratio
// of their tokens per second from the same minutes. On a shared machine the bandwidth a process gets drifts over
// minutes (on 2026-12-04 this VM's 2-thread triad had medians of 67 and 39 GB/s in runs ten minutes apart), and
// benchmarks run one after the other see different machines; paired steps see the same one. Which cache steps first
// alternates from token to token.
template <typename S>
void decode_step_paired(benchmark::State& state) {
  using clock = std::chrono::steady_clock;
  use_threads(state, 1);
  DecodeStepSetup<float> full(state.range(0));
  DecodeStepSetup<S> half(state.range(0));
  warm_up([&] {
    full.step();
    half.step();
  });
  const auto timed = [](auto& setup) {
    const clock::time_point start = clock::now();
    setup.step();
    benchmark::DoNotOptimize(setup.output.data());
    benchmark::ClobberMemory();
    return std::chrono::duration<double>(clock::now() - start).count();
  };
  double full_seconds = 0.0, half_seconds = 0.0;
  bool full_first = true;
  for (auto _ : state) {
    if (full_first) {
      full_seconds += timed(full);
      half_seconds += timed(half);
    } else {
      half_seconds += timed(half);
      full_seconds += timed(full);
    }
    full_first = !full_first;
  }
  const auto steps = static_cast<double>(state.iterations());
  state.counters["float_tokens/s"] = steps / full_seconds;
  state.counters["half_tokens/s"] = steps / half_seconds;
  state.counters["ratio"] = full_seconds / half_seconds;
}

void BM_decode_step(benchmark::State& state) { decode_step<float>(state); }
void BM_decode_step_bf16(benchmark::State& state) { decode_step<selfattn::bfloat16>(state); }
void BM_decode_step_f16(benchmark::State& state) { decode_step<selfattn::float16>(state); }
void BM_decode_step_bf16_weights(benchmark::State& state) { decode_step<selfattn::bfloat16, selfattn::bfloat16>(state); }
void BM_decode_step_paired_bf16(benchmark::State& state) { decode_step_paired<selfattn::bfloat16>(state); }

// One token through a 4-layer decoder (TransformerStack, decoder_layer_config(1024, 8): pre-norm, GELU FFN of 4096,
// RoPE; 48 MiB of float weights per layer) over caches of N tokens stored as S, with the parameters stored as W
// (TransformerStack::step_with; params_cast for 16 bits). Every layer's cache is truncated back to N after each step.
template <typename S = float, typename W = float>
void stack_step(benchmark::State& state) {
  use_threads(state, 1);
  const Index keys = state.range(0), layers = 4, embed = 8 * head_dim;
  selfattn::TransformerStackConfig cfg;
  cfg.layer = selfattn::decoder_layer_config(embed, 8);
  cfg.layer.attention.rope_dim = head_dim;
  cfg.num_layers = layers;
  cfg.final_norm = true;
  const selfattn::TransformerStack<float> model(cfg, 1);
  const selfattn::TransformerStackParams<W> weights = selfattn::params_cast<W>(model.params());
  auto cache = model.make_cache<S>(1, selfattn::CachePolicy::keep_all(keys + 1));
  const Index chunk = 1024;
  for (auto& layer_cache : cache.layers)
    for (Index filled_keys = 0; filled_keys < keys; filled_keys += chunk) {
      const auto rows = filled<3>({8, std::min(chunk, keys - filled_keys), head_dim});
      layer_cache.append(0, rows, rows);
    }
  const auto token = filled<3>({1, 1, embed});
  const auto run = [&] {
    benchmark::DoNotOptimize(model.step_with(weights, token, cache).data());
    for (auto& layer_cache : cache.layers) layer_cache.truncate(0, keys);
  };
  warm_up(run);
  for (auto _ : state) {
    run();
    benchmark::ClobberMemory();
  }
  double weight_bytes = 0.0;
  for (const auto& layer : weights.layers)
    for (const auto* w : {&layer.self_attn.q_weight, &layer.self_attn.k_weight, &layer.self_attn.v_weight,
                          &layer.self_attn.out_weight, &layer.linear1_weight, &layer.linear2_weight})
      weight_bytes += static_cast<double>(w->size()) * sizeof(W);
  // Bytes a step must read: every weight matrix and every layer's K and V.
  state.SetBytesProcessed(static_cast<int64_t>(static_cast<double>(state.iterations()) *
                                               (weight_bytes + static_cast<double>(layers) * kv_bytes(keys, 8, sizeof(S)))));
  state.counters["tokens/s"] = benchmark::Counter(1.0, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["weights_MiB"] = weight_bytes / (1024.0 * 1024.0);
  double cache_bytes = 0.0;
  for (const auto& layer_cache : cache.layers) cache_bytes += static_cast<double>(layer_cache.memory_bytes());
  state.counters["cache_MiB"] = cache_bytes / (1024.0 * 1024.0);
}
void BM_stack_step(benchmark::State& state) { stack_step<float, float>(state); }
void BM_stack_step_bf16(benchmark::State& state) { stack_step<selfattn::bfloat16, selfattn::bfloat16>(state); }

// The same token without a cache: a causal forward over the whole sequence, O(N^2) per generated token.
void BM_recompute(benchmark::State& state) {
  use_threads(state, 1);
  const Index keys = state.range(0);
  const auto mha = decoder(8, 8);
  const auto sequence = filled<3>({1, keys, 8 * head_dim});
  selfattn::AttentionOptions<float> causal;
  causal.causal = selfattn::Causal::top_left;
  for (auto _ : state) benchmark::DoNotOptimize(mha.forward(sequence, causal).output.data());
}

void decode_shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"", "H", "Hkv", "threads"});
  b->Args({128, 8, 8, 1});  // the CI smoke size
  for (Index keys : {1024, 4096, 16384, 32768, 65536})
    for (auto heads : {std::pair<Index, Index>{8, 8}, {32, 2}})
      for (int threads : {1, 2}) b->Args({keys, heads.first, heads.second, threads});
}

// The module's step: the CI smoke size, then caches of 4k to 64k tokens.
void step_shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"", "threads"})->Args({128, 1})->Args({4096, 1})->Args({32768, 1})->Args({32768, 2})->Args({65536, 1});
}

}  // namespace

BENCHMARK(BM_triad)->Apply(decode_shapes)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_decode_kernel)->Apply(decode_shapes)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_decode_general)->Apply(decode_shapes)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_decode_softcap)->Apply(decode_shapes)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_decode_kernel_bf16)->Apply(decode_shapes)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_decode_kernel_f16)->Apply(decode_shapes)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_decode_kernel_int8)->Apply(decode_shapes)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_decode_kernel_paired_int8)->Apply(decode_shapes)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_decode_step)->Apply(step_shapes)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_decode_step_bf16)->Apply(step_shapes)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_decode_step_f16)->Apply(step_shapes)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_decode_step_bf16_weights)->Apply(step_shapes)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_decode_step_paired_bf16)->Apply(step_shapes)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_stack_step)->ArgNames({"", "threads"})->Args({128, 1})->Args({4096, 1})->Args({4096, 2})
    ->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_stack_step_bf16)->ArgNames({"", "threads"})->Args({128, 1})->Args({4096, 1})->Args({4096, 2})
    ->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_recompute)->ArgNames({"", "threads"})->Args({128, 1})->Args({512, 1})->Args({2048, 1})
    ->UseRealTime()->Unit(benchmark::kMillisecond);
