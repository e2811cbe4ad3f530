// Benchmarks of the paged KV cache (docs/paged_cache.md): a decode step of 16 sequences of mixed lengths from one pool
// in one call (paged_attention), against the same step over 16 separate contiguous caches, one call per sequence
// (what MultiHeadAttention::step does over a KVCache of 16 sequences, and what 16 caches of one sequence each do).
//
//   BM_paged_step/N/H/Hkv/P/threads   16 sequences of lengths N/32 to N, geometrically spaced (1k to 32k for
//                                     N = 32768), D = 128, one query row each, pages of P tokens; the paged step and
//                                     the 16 separate steps in alternation in one loop, each timed:
//                                     paged_tokens/s, separate_tokens/s (16 tokens per step) and paged/separate
//                                     from the same minutes; GB/s of K and V read by the paged step
//   BM_paged_shared_prefix/N/...      16 sequences forked from one prompt of N/2 tokens, each then given N/32 tokens
//                                     of its own: the same pair of steps, and the bytes each layout holds
//                                     (pool_MB: the pages in use, shared ones once; separate_MB: 16 contiguous caches)
//
// Threads: with OpenMP the last argument picks the thread count (1 or 2).
#include <benchmark/benchmark.h>

#include <selfattn/selfattn.hpp>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace {

using selfattn::Index;
using selfattn::Tensor;

constexpr Index head_dim = 128;
constexpr Index sequences = 16;

void use_threads(benchmark::State& state, int argument) {
  const int threads = static_cast<int>(state.range(argument));
#ifdef _OPENMP
  omp_set_num_threads(threads);
#else
  if (threads != 1) state.SkipWithError("built without OpenMP: one thread only");
#endif
}

/// Values in [-0.5, 0.5) from a multiplicative hash (cheap: the pools hold hundreds of millions of them).
Tensor<float, 3> filled(Index kv_heads, Index n, double phase) {
  Tensor<float, 3> t({kv_heads, n, head_dim});
  const auto seed = static_cast<std::uint64_t>(phase * 1000.0);
  for (Index i = 0; i < t.size(); ++i)
    t.data()[i] = static_cast<float>(((static_cast<std::uint64_t>(i) + seed) * 2654435761u) % 1024) / 1024.0f - 0.5f;
  return t;
}

/// The same keys and values twice: in one pool (paged) and as one contiguous (1, Hkv, L, D) tensor per sequence.
struct TwoLayouts {
  selfattn::PagedKVCache<float> pool;
  std::vector<Index> ids;
  std::vector<Tensor<float, 4>> keys, values;  // the separate caches
  std::vector<Index> lengths;

  TwoLayouts(Index kv_heads, Index page_rows, Index pages) : pool({pages, kv_heads, head_dim, 0, page_rows}) {}

  /// A separate cache holding what pool sequence `id` holds.
  void mirror(Index id) {
    const Tensor<float, 3> k = pool.keys(id), v = pool.values(id);
    Tensor<float, 4> k4({1, k.dim(0), k.dim(1), head_dim}), v4({1, v.dim(0), v.dim(1), head_dim});
    std::copy(k.data(), k.data() + k.size(), k4.data());
    std::copy(v.data(), v.data() + v.size(), v4.data());
    keys.push_back(std::move(k4));
    values.push_back(std::move(v4));
    lengths.push_back(k.dim(1));
  }

  double bytes() const {
    double total = 0;
    for (const Index length : lengths) total += 2.0 * static_cast<double>(pool.kv_heads() * length * head_dim) * 4.0;
    return total;
  }
};

Index pages_for(double tokens, Index page_rows) {
  return static_cast<Index>(tokens / static_cast<double>(page_rows)) + 2 * sequences + 4;
}

/// The paged step and the separate steps in alternation, each timed (absolute times drift between runs on a shared
/// machine; alternating steps see the same one).
void run_pair(benchmark::State& state, TwoLayouts& layouts, Index heads) {
  using clock = std::chrono::steady_clock;
  const Index kv_heads = layouts.pool.kv_heads();
  const Tensor<float, 4> q = [&] {
    Tensor<float, 4> t({sequences, heads, 1, head_dim});
    for (Index i = 0; i < t.size(); ++i) t.data()[i] = static_cast<float>(std::cos(0.01 * static_cast<double>(i)));
    return t;
  }();
  Tensor<float, 4> out({sequences, heads, 1, head_dim}), out_one({1, heads, 1, head_dim});
  Tensor<float, 3> lse({sequences, heads, 1}), lse_one({1, heads, 1});
  selfattn::AttentionWorkspace<float> paged_ws, separate_ws;
  const auto paged = [&] {
    selfattn::paged_attention_into(q.view(), layouts.pool, layouts.ids, out.view(), lse.view(), paged_ws);
  };
  const auto separate = [&] {
    for (Index b = 0; b < sequences; ++b) {
      const selfattn::TensorView<const float, 4> q_b(&q(b, 0, 0, 0), {1, heads, 1, head_dim});
      selfattn::sdpa_forward_into(q_b, layouts.keys[static_cast<std::size_t>(b)].view(),
                                  layouts.values[static_cast<std::size_t>(b)].view(), out_one.view(), lse_one.view(),
                                  selfattn::AttentionOptions<float>{}, separate_ws);
    }
  };
  for (int pass = 0; pass < 2; ++pass) {  // first passes over fresh memory are slow on a virtual machine
    paged();
    separate();
  }
  const auto timed = [](const auto& step) {
    const clock::time_point start = clock::now();
    step();
    benchmark::ClobberMemory();
    return std::chrono::duration<double>(clock::now() - start).count();
  };
  double paged_seconds = 0, separate_seconds = 0;
  bool paged_first = true;
  for (auto _ : state) {
    if (paged_first) {
      paged_seconds += timed(paged);
      separate_seconds += timed(separate);
    } else {
      separate_seconds += timed(separate);
      paged_seconds += timed(paged);
    }
    paged_first = !paged_first;
  }
  const auto steps = static_cast<double>(state.iterations());
  state.counters["paged_tokens/s"] = steps * static_cast<double>(sequences) / paged_seconds;
  state.counters["separate_tokens/s"] = steps * static_cast<double>(sequences) / separate_seconds;
  state.counters["paged/separate"] = separate_seconds / paged_seconds;
  state.counters["paged_GB/s"] = steps * layouts.bytes() / paged_seconds / 1e9;
  state.counters["pool_MB"] = static_cast<double>(layouts.pool.used_bytes()) / 1e6;
  state.counters["separate_MB"] = layouts.bytes() / 1e6;
  (void)kv_heads;
}

void BM_paged_step(benchmark::State& state) {
  use_threads(state, 4);
  const Index longest = state.range(0), heads = state.range(1), kv_heads = state.range(2), page_rows = state.range(3);
  std::vector<Index> lengths;
  double tokens = 0;
  for (Index b = 0; b < sequences; ++b) {  // N / 32 ... N, geometrically
    lengths.push_back(std::max<Index>(
        1, static_cast<Index>(
               std::llround(static_cast<double>(longest) / 32.0 * std::pow(32.0, static_cast<double>(b) / 15.0)))));
    tokens += static_cast<double>(lengths.back());
  }
  TwoLayouts layouts(kv_heads, page_rows, pages_for(tokens, page_rows));
  for (Index b = 0; b < sequences; ++b) {
    const Index id = layouts.pool.start();
    const Index n = lengths[static_cast<std::size_t>(b)];
    layouts.pool.append(id, filled(kv_heads, n, static_cast<double>(b)),
                        filled(kv_heads, n, 0.5 + static_cast<double>(b)));
    layouts.ids.push_back(id);
    layouts.mirror(id);
  }
  run_pair(state, layouts, heads);
}

void BM_paged_shared_prefix(benchmark::State& state) {
  use_threads(state, 4);
  const Index longest = state.range(0), heads = state.range(1), kv_heads = state.range(2), page_rows = state.range(3);
  const Index prompt = longest / 2, own = std::max<Index>(1, longest / 32);
  TwoLayouts layouts(kv_heads, page_rows,
                     pages_for(static_cast<double>(prompt + sequences * (own + page_rows)), page_rows));
  const Index root = layouts.pool.start();
  layouts.pool.append(root, filled(kv_heads, prompt, 0.0), filled(kv_heads, prompt, 0.5));
  for (Index b = 0; b < sequences; ++b) {
    const Index id = layouts.pool.fork(root);
    layouts.pool.append(id, filled(kv_heads, own, static_cast<double>(b)),
                        filled(kv_heads, own, 0.5 + static_cast<double>(b)));
    layouts.ids.push_back(id);
    layouts.mirror(id);
  }
  layouts.pool.end(root);
  run_pair(state, layouts, heads);
}

void shapes(benchmark::internal::Benchmark* b) {
  for (const int threads : {1, 2}) {
    b->Args({128, 8, 8, 16, threads});  // the smoke run's size
    for (const Index page_rows : {16, 256}) {
      b->Args({32768, 8, 8, page_rows, threads});
      b->Args({32768, 32, 8, page_rows, threads});
    }
  }
}

}  // namespace

BENCHMARK(BM_paged_step)->Apply(shapes)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_paged_shared_prefix)->Apply(shapes)->UseRealTime()->Unit(benchmark::kMillisecond);
