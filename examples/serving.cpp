// Serving many sequences from one pool of pages (docs/paged_cache.md): sixteen requests of different lengths, four of
// which share a system prompt, decoded together by one attention module over a PagedKVCache.
//
// What it shows, and checks (exit code 1 if a claim fails):
//   1. every request's outputs equal what the module computes over a KVCache of its own (float rounding apart);
//   2. the four forks of the system prompt hold it once: the pool uses fewer bytes than sixteen separate caches;
//   3. a request that ends gives its pages back, and a new one takes them.
// It prints the requests, the pages each holds, and the bytes of both layouts.
#include <selfattn/selfattn.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

namespace {

using selfattn::Index;
using selfattn::Tensor;

Tensor<float, 3> random_tokens(std::mt19937& rng, Index batch, Index n, Index embed) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Tensor<float, 3> x({batch, n, embed});
  for (Index i = 0; i < x.size(); ++i) x.data()[i] = normal(rng);
  return x;
}

/// Rows [from, from + n) of batch b of x (B, L, E), as (1, n, E).
Tensor<float, 3> rows(const Tensor<float, 3>& x, Index b, Index from, Index n) {
  Tensor<float, 3> out({1, n, x.dim(2)});
  for (Index l = 0; l < n; ++l)
    for (Index e = 0; e < x.dim(2); ++e) out(0, l, e) = x(b, from + l, e);
  return out;
}

float max_difference(const Tensor<float, 3>& a, const Tensor<float, 3>& b) {
  float worst = 0.0f;
  for (Index i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(a.data()[i] - b.data()[i]));
  return worst;
}

bool check(bool ok, const char* claim) {
  std::printf("%s  %s\n", ok ? "[ok]  " : "[FAIL]", claim);
  return ok;
}

}  // namespace

int main() {
  selfattn::MultiHeadAttentionConfig cfg;
  cfg.embed_dim = 128;
  cfg.num_heads = 8;
  cfg.num_kv_heads = 2;
  cfg.rope_dim = 16;
  const selfattn::MultiHeadAttention<float> mha(cfg, 7);
  const Index embed = cfg.embed_dim, head_dim = embed / cfg.num_heads;
  std::mt19937 rng(2026);

  // The pool: pages of 16 tokens (small, so that the example's short requests span several).
  selfattn::PagedKVCache<float> pool({/*pages=*/256, cfg.num_kv_heads, head_dim, 0, /*page_rows=*/16});

  // Twelve requests of their own and four forks of one system prompt; each also kept in a KVCache of its own.
  const Index system_prompt = 200, requests = 16, forks = 4;
  std::vector<Index> ids;
  std::vector<selfattn::KVCache<float>> own;
  const auto prefill = [&](Index id, selfattn::KVCache<float>& cache, const Tensor<float, 3>& prompt) {
    for (Index from = 0; from < prompt.dim(1); from += 16) {  // 16 tokens per step, the paged step's most
      const Index n = std::min<Index>(16, prompt.dim(1) - from);
      mha.step(rows(prompt, 0, from, n), pool, {id});
      mha.step(rows(prompt, 0, from, n), cache);
    }
  };
  const Index root = pool.start();
  selfattn::KVCache<float> root_cache = mha.make_cache(1);
  prefill(root, root_cache, random_tokens(rng, 1, system_prompt, embed));
  for (Index r = 0; r < requests; ++r) {
    const Index prompt = 8 + static_cast<Index>(rng() % 200);
    if (r < forks) {  // the system prompt, then a question of its own
      ids.push_back(pool.fork(root));
      own.push_back(root_cache);
    } else {
      ids.push_back(pool.start());
      own.push_back(mha.make_cache(1));
    }
    prefill(ids.back(), own.back(), random_tokens(rng, 1, prompt, embed));
  }
  pool.end(root);  // the forks keep its pages

  // Decode all sixteen together, one token each per step, and each alone over its own cache.
  float worst = 0.0f;
  const Index steps = 24;
  for (Index step = 0; step < steps; ++step) {
    const Tensor<float, 3> tokens = random_tokens(rng, requests, 1, embed);
    const Tensor<float, 3> together = mha.step(tokens, pool, ids);
    for (Index r = 0; r < requests; ++r) {
      const Tensor<float, 3> alone = mha.step(rows(tokens, r, 0, 1), own[static_cast<std::size_t>(r)]);
      worst = std::max(worst, max_difference(rows(together, r, 0, 1), alone));
    }
  }

  std::printf("request  tokens  pages  shared pages\n");
  for (Index r = 0; r < requests; ++r) {
    const std::vector<std::int32_t>& pages = pool.page_table(ids[static_cast<std::size_t>(r)]);
    const auto shared = std::count_if(pages.begin(), pages.end(), [&](std::int32_t p) { return pool.shares(p) > 1; });
    std::printf("%7lld  %6lld  %5zu  %12ld%s\n", static_cast<long long>(r),
                static_cast<long long>(pool.length(ids[static_cast<std::size_t>(r)])), pages.size(),
                static_cast<long>(shared), r < forks ? "   (system prompt fork)" : "");
  }
  double separate_bytes = 0;
  for (Index r = 0; r < requests; ++r)
    separate_bytes += 2.0 * static_cast<double>(cfg.num_kv_heads * pool.length(ids[static_cast<std::size_t>(r)]) *
                                                head_dim * static_cast<Index>(sizeof(float)));
  std::printf("\npool: %lld of %lld pages in use, %.1f KB; sixteen caches of exactly their tokens: %.1f KB\n",
              static_cast<long long>(pool.used_pages()), static_cast<long long>(pool.pages()),
              static_cast<double>(pool.used_bytes()) / 1024.0, separate_bytes / 1024.0);
  std::printf("largest difference from each request's own cache over %lld steps: %.2e\n\n",
              static_cast<long long>(steps), static_cast<double>(worst));

  bool ok = check(worst < 1e-4f, "the batched paged step equals each request's own cache");
  ok &= check(static_cast<double>(pool.used_bytes()) < separate_bytes,
              "the pool holds the shared system prompt once: fewer bytes than separate caches");
  const Index free_before = pool.free_pages(), ended_pages = static_cast<Index>(pool.page_table(ids[10]).size());
  pool.end(ids[10]);
  const Index freed = pool.free_pages() - free_before;
  const Index next = pool.start();
  mha.step(random_tokens(rng, 1, 16, embed), pool, {next});
  ok &= check(freed == ended_pages && pool.free_pages() == free_before + ended_pages - 1,
              "an ended request gives its pages back, and a new one takes them");
  return ok ? 0 : 1;
}
