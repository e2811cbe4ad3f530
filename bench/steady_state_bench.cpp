// The steady state of a decoding loop: MultiHeadAttention::step (allocates its results and scratch every call)
// against step_into (buffers in the cache's MhaWorkspace), in one run, with the heap allocations per token
// counted by a replaced global operator new next to tokens/s.
//
//   BM_step_loop/N/into   one token per iteration over a cache of N tokens (E = 1024, H = 8, Hkv = 2, RoPE);
//                         into = 0: step, into = 1: step_into. Counters: tokens/s, allocs/token (operator new
//                         calls per token; Eigen's own heap use goes through malloc and is checked by
//                         tests/allocation_test.cpp instead).
//
// The cache is reserved for N plus the iterations, so that it never grows inside the loop; the iteration count is
// fixed for the same reason.
#include <benchmark/benchmark.h>

#include <selfattn/selfattn.hpp>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <new>

namespace {
std::atomic<long long> new_calls{0};

void* counted_new(std::size_t size, std::size_t alignment) {
  new_calls.fetch_add(1, std::memory_order_relaxed);
  if (size == 0) size = 1;
  void* p = alignment > alignof(std::max_align_t)
                ? std::aligned_alloc(alignment, (size + alignment - 1) / alignment * alignment)
                : std::malloc(size);
  if (!p) throw std::bad_alloc();
  return p;
}
}  // namespace

void* operator new(std::size_t size) { return counted_new(size, alignof(std::max_align_t)); }
void* operator new[](std::size_t size) { return counted_new(size, alignof(std::max_align_t)); }
void* operator new(std::size_t size, std::align_val_t a) { return counted_new(size, static_cast<std::size_t>(a)); }
void* operator new[](std::size_t size, std::align_val_t a) { return counted_new(size, static_cast<std::size_t>(a)); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }

namespace {

using selfattn::Index;
using selfattn::Tensor;

constexpr Index head_dim = 128, heads = 8, kv_heads = 2, embed = heads * head_dim;
constexpr int loop_tokens = 400;

template <int Rank>
Tensor<float, Rank> filled(const std::array<Index, Rank>& shape) {
  Tensor<float, Rank> t(shape);
  for (Index n = 0; n < t.size(); ++n) t.data()[n] = static_cast<float>(std::sin(0.001 * static_cast<double>(n)));
  return t;
}

void BM_step_loop(benchmark::State& state) {
  const Index keys = state.range(0);
  const bool into = state.range(1) != 0;
  selfattn::MultiHeadAttentionConfig cfg;
  cfg.embed_dim = embed;
  cfg.num_heads = heads;
  cfg.num_kv_heads = kv_heads;
  cfg.rope_dim = head_dim;
  const selfattn::MultiHeadAttention<float> mha(cfg, 1);
  auto cache = mha.make_cache(1);
  cache.reserve(keys + loop_tokens + 2);
  mha.step(filled<3>({1, keys, embed}), cache);  // the prompt
  const auto token = filled<3>({1, 1, embed});
  Tensor<float, 3> y({1, 1, embed});
  if (into) mha.step_into(token, cache, y);  // warm-up of the one-token shape
  const long long before = new_calls.load();
  for (auto _ : state) {
    if (into) {
      mha.step_into(token, cache, y);
      benchmark::DoNotOptimize(y.data());
    } else {
      benchmark::DoNotOptimize(mha.step(token, cache).data());
    }
    benchmark::ClobberMemory();
  }
  const long long allocations = new_calls.load() - before;  // before the counters map allocates its entries
  const double tokens = static_cast<double>(state.iterations());
  state.counters["tokens/s"] = benchmark::Counter(tokens, benchmark::Counter::kIsRate);
  state.counters["allocs/token"] = static_cast<double>(allocations) / tokens;
}

}  // namespace

BENCHMARK(BM_step_loop)->ArgNames({"", "into"})->Args({128, 0})->Args({128, 1})->Args({4096, 0})->Args({4096, 1})
    ->Args({32768, 0})->Args({32768, 1})->Iterations(loop_tokens)->UseRealTime()->Unit(benchmark::kMicrosecond);
