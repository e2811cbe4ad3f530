// The paged KV cache (paged_cache.hpp) and the batched varlen decode step over it (paged_attention.hpp):
//
//   - the cache's bookkeeping: what a sequence holds after appends interleaved with other sequences' (so that its
//     pages are scattered over the pool), forks that share pages and copy the page where they part, truncation, ends
//     that return pages, growth of the pool; every error named, with the cache unchanged;
//   - paged_attention equals each sequence's own sdpa_forward over its keys and values gathered from the pages, on
//     the decode kernel, for every storage type (float, double, bfloat16, float16, int8): bit for bit where a page
//     holds whole chunks of the kernel (page_rows >= 256, the same chunks as the contiguous call) or a sequence's
//     pages are consecutive (read as whole chunks too), within rounding for smaller pages out of order (read page by
//     page, merged in another order); over mask kinds (none, causal, sliding window, ALiBi,
//     soft-capping, sinks), GQA, several query rows per sequence and sequences of unequal lengths, shared prefixes
//     among them;
//   - every error of paged_attention named, nothing written;
//   - MultiHeadAttention::step over a paged cache (prompts fed 16 tokens at a time, one sequence per call; then
//     decode steps of every sequence in one call, a fork among them) equals step over one KVCache per sequence.
#include <selfattn/attention.hpp>
#include <selfattn/nn/multihead.hpp>
#include <selfattn/paged_attention.hpp>
#include <selfattn/paged_cache.hpp>
#include <selfattn/quantized.hpp>

#include "support/compare.hpp"
#include "support/expect_error.hpp"
#include "support/random.hpp"
#include "support/sanitizers.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace selfattn::test {
namespace {

/// (Hkv, n, D) rows of seed `seed`.
template <typename T>
Tensor<T, 3> rows(Random& random, Index kv_heads, Index n, Index dim) {
  return random.normal_tensor<T, 3>({kv_heads, n, dim});
}

/// Rows [from, from + n) of x (Hkv, L, D) as a tensor.
template <typename T>
Tensor<T, 3> slice(const Tensor<T, 3>& x, Index from, Index n) {
  Tensor<T, 3> out({x.dim(0), n, x.dim(2)});
  for (Index h = 0; h < x.dim(0); ++h)
    for (Index l = 0; l < n; ++l)
      for (Index e = 0; e < x.dim(2); ++e) out(h, l, e) = x(h, from + l, e);
  return out;
}

/// What storage type S makes of float rows: the value a cache of S holds (rounded to 16 bits, or x̂ of int8).
template <typename T, typename S>
Tensor<T, 3> stored(const Tensor<T, 3>& x) {
  Tensor<T, 3> out(x.shape());
  if constexpr (std::is_same_v<S, T>) {
    return x;
  } else if constexpr (std::is_same_v<S, std::int8_t>) {
    for (Index h = 0; h < x.dim(0); ++h)
      for (Index l = 0; l < x.dim(1); ++l) {
        std::vector<std::int8_t> q(static_cast<std::size_t>(x.dim(2)));
        std::vector<bfloat16> scales(static_cast<std::size_t>(int8_blocks(x.dim(2))));
        quantize_int8_row(&x(h, l, 0), x.dim(2), q.data(), scales.data());
        for (Index e = 0; e < x.dim(2); ++e) out(h, l, e) = dequantize_int8(q.data(), scales.data(), e);
      }
  } else {
    for (Index n = 0; n < x.size(); ++n) out.data()[n] = detail::widen<T>(detail::narrow<S>(x.data()[n]));
  }
  return out;
}

/// Sequences grown in rounds, each round appending a random piece to every sequence that still wants tokens, so
/// that the pages of one sequence are scattered over the pool; `full` keeps what each was given.
template <typename T, typename S>
struct Grown {
  std::vector<Index> ids;
  std::vector<Tensor<T, 3>> keys, values;  // as stored (rounded for 16 bits, x̂ for int8)
};

template <typename T, typename S>
Grown<T, S> grow_sequences(PagedKVCache<T, S>& cache, Random& random, const std::vector<Index>& lengths) {
  Grown<T, S> g;
  const Index hkv = cache.kv_heads(), d = cache.head_dim(), dv = cache.value_dim();
  std::vector<Tensor<T, 3>> k_all, v_all;
  for (const Index length : lengths) {
    g.ids.push_back(cache.start());
    k_all.push_back(rows<T>(random, hkv, length, d));
    v_all.push_back(rows<T>(random, hkv, length, dv));
  }
  std::vector<Index> done(lengths.size(), 0);
  for (bool more = true; more;) {
    more = false;
    for (std::size_t s = 0; s < lengths.size(); ++s) {
      const Index n = std::min(lengths[s] - done[s], random.integer(1, 3 * cache.page_rows() / 2));
      if (n <= 0) continue;
      cache.append(g.ids[s], slice(k_all[s], done[s], n), slice(v_all[s], done[s], n));
      done[s] += n;
      more = true;
    }
  }
  for (std::size_t s = 0; s < lengths.size(); ++s) {
    g.keys.push_back(stored<T, S>(k_all[s]));
    g.values.push_back(stored<T, S>(v_all[s]));
  }
  return g;
}

/// x (Hkv, L, D) as (1, Hkv, L, D).
template <typename T>
TensorView<const T, 4> as_batch(const Tensor<T, 3>& x) {
  return TensorView<const T, 4>(x.data(), {1, x.dim(0), x.dim(1), x.dim(2)});
}

/// Each sequence's own call: sdpa_forward of its query rows over its keys and values, on the decode kernel.
template <typename T>
AttentionForward<T> per_sequence(const Tensor<T, 4>& q, const std::vector<Tensor<T, 3>>& keys,
                                 const std::vector<Tensor<T, 3>>& values, const std::vector<std::size_t>& of,
                                 AttentionOptions<T> opts) {
  AttentionForward<T> result;
  result.out = Tensor<T, 4>({q.dim(0), q.dim(1), q.dim(2), values[0].dim(2)});
  result.lse = Tensor<T, 3>({q.dim(0), q.dim(1), q.dim(2)});
  opts.kernel = Kernel::decode;
  for (Index b = 0; b < q.dim(0); ++b) {
    const std::size_t s = of[static_cast<std::size_t>(b)];
    const TensorView<const T, 4> q_b(&q(b, 0, 0, 0), {1, q.dim(1), q.dim(2), q.dim(3)});
    const AttentionForward<T> one = sdpa_forward(q_b, as_batch(keys[s]), as_batch(values[s]), opts);
    for (Index n = 0; n < one.out.size(); ++n) result.out.data()[b * one.out.size() + n] = one.out.data()[n];
    for (Index n = 0; n < one.lse.size(); ++n) result.lse.data()[b * one.lse.size() + n] = one.lse.data()[n];
  }
  return result;
}

struct MaskKind {
  const char* name;
  Causal causal;
  Index window_left;
  bool alibi;
  float softcap;
  bool sinks;
};

const std::vector<MaskKind>& mask_kinds() {
  static const std::vector<MaskKind> kinds{
      {"none", Causal::none, -1, false, 0.0f, false},
      {"causal", Causal::bottom_right, -1, false, 0.0f, false},
      {"window", Causal::bottom_right, 300, false, 0.0f, false},
      {"alibi", Causal::bottom_right, -1, true, 0.0f, false},
      {"softcap", Causal::bottom_right, -1, false, 2.0f, false},
      {"sinks", Causal::none, -1, false, 0.0f, true},
  };
  return kinds;
}

template <typename T>
AttentionOptions<T> options_of(const MaskKind& kind, Index heads, Random& random) {
  AttentionOptions<T> opts;
  opts.causal = kind.causal;
  opts.window_left = kind.window_left;
  if (kind.alibi) opts.alibi_slopes = alibi_slopes<T>(heads);
  opts.softcap = static_cast<T>(kind.softcap);
  if (kind.sinks)
    for (Index h = 0; h < heads; ++h) opts.sinks.push_back(static_cast<T>(random.normal()));
  return opts;
}

/// One sweep: sequences of unequal lengths (some a whole number of pages, one of a single token), two of them forks
/// sharing a prefix, the batch listing them in another order and one twice; every mask kind, heads, query rows.
template <typename T, typename S>
void check_against_per_sequence(Index page_rows, std::uint64_t seed) {
  Random random(seed);
  const Index kv_heads = 2, head_dim = 40, value_dim = 24;
  PagedKVCache<T, S> cache({/*pages=*/4096 / page_rows + 16, kv_heads, head_dim, value_dim, page_rows});
  // Lengths that cross the kernel's chunks of 256 and end inside them (under ASan the sweep's cost is these keys).
  const std::vector<Index> lengths{300, 3, std::min<Index>(page_rows * 2, 512), 530};
  Grown<T, S> g = grow_sequences(cache, random, lengths);
  // A fork of the longest sequence (sharing its pages) that goes on differently.
  const Index fork = cache.fork(g.ids[3]);
  const Tensor<T, 3> more_k = rows<T>(random, kv_heads, 37, head_dim),
                     more_v = rows<T>(random, kv_heads, 37, value_dim);
  cache.append(fork, more_k, more_v);
  g.ids.push_back(fork);
  g.keys.push_back(cache.keys(fork));
  g.values.push_back(cache.values(fork));
  ASSERT_EQ(cache.length(g.ids[3]), 530);  // the parent is unchanged by its fork's append
  EXPECT_TRUE(all_close(cache.keys(g.ids[3]), g.keys[3], 0.0));

  const std::vector<std::size_t> batch_of{4, 0, 3, 1, 2, 0};  // the fork first, sequence 0 twice
  std::vector<Index> sequences;
  for (const std::size_t s : batch_of) sequences.push_back(g.ids[s]);
  // Bit for bit when every chunk of the kernel lies in one page, as in the contiguous call.
  const double tolerance = page_rows >= detail::decode_chunk ? 0.0 : default_tolerance<T>();
  std::size_t combination = 0;  // of heads and rows: under a sanitizer each meets a third of the mask kinds
  for (const Index heads : {2, 8})
    for (const Index q_len : {1, 3}) {
      for (std::size_t k = 0; k < mask_kinds().size(); ++k) {
        if (!test::sweep_pair_runs(combination, k)) continue;
        const MaskKind& kind = mask_kinds()[k];
        SCOPED_TRACE(std::string(kind.name) + ", heads " + std::to_string(heads) + ", rows " + std::to_string(q_len) +
                     ", page_rows " + std::to_string(page_rows));
        const AttentionOptions<T> opts = options_of<T>(kind, heads, random);
        const Tensor<T, 4> q =
            random.normal_tensor<T, 4>({static_cast<Index>(sequences.size()), heads, q_len, head_dim});
        const AttentionForward<T> paged = paged_attention(q, cache, sequences, opts);
        const AttentionForward<T> expected = per_sequence(q, g.keys, g.values, batch_of, opts);
        EXPECT_TRUE(all_close(paged.out, expected.out, tolerance));
        EXPECT_TRUE(all_close(paged.lse, expected.lse, tolerance));
      }
      ++combination;
    }
}

TEST(PagedAttention, EqualsEachSequencesOwnCallFloat) {
  for (const Index page_rows : {16, 256, 512}) check_against_per_sequence<float, float>(page_rows, 11);
}

TEST(PagedAttention, EqualsEachSequencesOwnCallDouble) {
  for (const Index page_rows : {32, 256}) check_against_per_sequence<double, double>(page_rows, 12);
}

TEST(PagedAttention, EqualsEachSequencesOwnCallSixteenBit) {
  check_against_per_sequence<float, bfloat16>(256, 13);
  check_against_per_sequence<float, float16>(64, 15);
}

TEST(PagedAttention, EqualsEachSequencesOwnCallInt8) {
  check_against_per_sequence<float, std::int8_t>(256, 16);
  check_against_per_sequence<float, std::int8_t>(32, 17);
}

TEST(PagedAttention, ReadsConsecutivePagesAsTheContiguousCallDoes) {
  // Pages of 16 given out one after another (a sequence appended at once): consecutive in memory, read in the
  // kernel's chunks of 256 keys, so bit for bit the contiguous call. A sequence grown alongside another has its
  // pages interleaved with the other's: read page by page, equal within rounding.
  Random random(18);
  PagedKVCache<float> cache({200, 2, 32, 0, 16});
  Grown<float, float> whole = grow_sequences(cache, random, {1000});  // one sequence: one append per round, in order
  Grown<float, float> interleaved = grow_sequences(cache, random, {700, 900});
  const std::vector<Index> sequences{whole.ids[0], interleaved.ids[0], interleaved.ids[1]};
  const std::vector<Tensor<float, 3>> keys{whole.keys[0], interleaved.keys[0], interleaved.keys[1]};
  const std::vector<Tensor<float, 3>> values{whole.values[0], interleaved.values[0], interleaved.values[1]};
  const Tensor<float, 4> q = random.normal_tensor<float, 4>({3, 8, 2, 32});
  AttentionOptions<float> opts;
  opts.causal = Causal::bottom_right;
  const AttentionForward<float> paged = paged_attention(q, cache, sequences, opts);
  const AttentionForward<float> expected = per_sequence(q, keys, values, {0, 1, 2}, opts);
  const auto batch = [](const Tensor<float, 4>& x, Index b) {
    return Tensor<float, 4>(TensorView<const float, 4>(&x(b, 0, 0, 0), {1, x.dim(1), x.dim(2), x.dim(3)}));
  };
  EXPECT_TRUE(all_close(batch(paged.out, 0), batch(expected.out, 0), 0.0));
  EXPECT_TRUE(all_close(paged.out, expected.out, default_tolerance<float>()));
}

TEST(PagedAttention, IntoAWorkspaceEqualsTheAllocatingCall) {
  Random random(21);
  PagedKVCache<float> cache({32, 2, 32, 0, 64});
  Grown<float, float> g = grow_sequences(cache, random, {100, 500, 64});
  const Tensor<float, 4> q = random.normal_tensor<float, 4>({3, 4, 1, 32});
  const AttentionForward<float> expected = paged_attention(q, cache, g.ids);
  AttentionWorkspace<float> workspace;
  Tensor<float, 4> out({3, 4, 1, 32});
  Tensor<float, 3> lse({3, 4, 1});
  for (int call = 0; call < 2; ++call) {  // the second call reuses the workspace
    paged_attention_into(q.view(), cache, g.ids, out.view(), lse.view(), workspace);
    EXPECT_TRUE(all_close(out, expected.out, 0.0));
    EXPECT_TRUE(all_close(lse, expected.lse, 0.0));
  }
}

TEST(PagedKVCache, ForksShareTheirPrefixAndCopyThePageWhereTheyPart) {
  Random random(31);
  const Index page_rows = 16;
  PagedKVCache<float> cache({20, 1, 8, 0, page_rows});
  const Index parent = cache.start();
  const Tensor<float, 3> prefix_k = rows<float>(random, 1, 40, 8), prefix_v = rows<float>(random, 1, 40, 8);
  cache.append(parent, prefix_k, prefix_v);  // 2 full pages and 8 rows of a third
  EXPECT_EQ(cache.used_pages(), 3);
  const Index child = cache.fork(parent);
  EXPECT_EQ(cache.used_pages(), 3);  // nothing copied yet
  for (const std::int32_t page : cache.page_table(parent)) EXPECT_EQ(cache.shares(page), 2);

  const Tensor<float, 3> child_k = rows<float>(random, 1, 5, 8), child_v = rows<float>(random, 1, 5, 8);
  cache.append(child, child_k, child_v);  // into the shared third page: copied first
  EXPECT_EQ(cache.used_pages(), 4);
  const std::vector<std::int32_t>& p = cache.page_table(parent);
  const std::vector<std::int32_t>& c = cache.page_table(child);
  EXPECT_EQ(p[0], c[0]);
  EXPECT_EQ(p[1], c[1]);
  EXPECT_NE(p[2], c[2]);
  EXPECT_EQ(cache.shares(p[0]), 2);
  EXPECT_EQ(cache.shares(p[2]), 1);
  EXPECT_EQ(cache.length(parent), 40);
  EXPECT_EQ(cache.length(child), 45);
  EXPECT_TRUE(all_close(cache.keys(parent), prefix_k, 0.0));
  const Tensor<float, 3> child_keys = cache.keys(child);
  EXPECT_TRUE(all_close(slice(child_keys, 0, 40), prefix_k, 0.0));
  EXPECT_TRUE(all_close(slice(child_keys, 40, 5), child_k, 0.0));
  EXPECT_TRUE(all_close(slice(cache.values(child), 40, 5), child_v, 0.0));

  // The parent appends into its own (no longer shared) third page: no copy.
  cache.append(parent, rows<float>(random, 1, 3, 8), rows<float>(random, 1, 3, 8));
  EXPECT_EQ(cache.used_pages(), 4);
  EXPECT_TRUE(all_close(slice(cache.keys(child), 0, 40), prefix_k, 0.0));

  // Ending the parent frees only the page no one else holds.
  cache.end(parent);
  EXPECT_FALSE(cache.is_live(parent));
  EXPECT_EQ(cache.used_pages(), 3);
  EXPECT_EQ(cache.shares(c[0]), 1);
  cache.end(child);
  EXPECT_EQ(cache.used_pages(), 0);
  EXPECT_EQ(cache.free_pages(), 20);
  EXPECT_EQ(cache.start(), child);  // numbers are reused
}

TEST(PagedKVCache, ForkOnAPageBoundaryCopiesNothing) {
  Random random(32);
  PagedKVCache<float> cache({8, 1, 4, 0, 16});
  const Index parent = cache.start();
  cache.append(parent, rows<float>(random, 1, 32, 4), rows<float>(random, 1, 32, 4));
  const Index child = cache.fork(parent);
  cache.append(child, rows<float>(random, 1, 1, 4), rows<float>(random, 1, 1, 4));
  EXPECT_EQ(cache.used_pages(), 3);  // two shared pages and the child's new one
}

TEST(PagedKVCache, TruncateReturnsPagesAndAppendsAfterIt) {
  Random random(33);
  PagedKVCache<float, bfloat16> cache({8, 2, 8, 4, 16});
  const Index s = cache.start();
  const Tensor<float, 3> k = rows<float>(random, 2, 50, 8), v = rows<float>(random, 2, 50, 4);
  cache.append(s, k, v);
  EXPECT_EQ(cache.used_pages(), 4);
  const Index fork = cache.fork(s);
  cache.truncate(s, 20);  // keeps pages 0 and 1 (shared with the fork), drops its hold on 2 and 3
  EXPECT_EQ(cache.length(s), 20);
  EXPECT_EQ(cache.used_pages(), 4);  // the fork still holds all four
  const Tensor<float, 3> more_k = rows<float>(random, 2, 3, 8), more_v = rows<float>(random, 2, 3, 4);
  cache.append(s, more_k, more_v);  // into page 1, shared with the fork: copied
  EXPECT_EQ(cache.used_pages(), 5);
  EXPECT_TRUE(all_close(cache.keys(fork), stored<float, bfloat16>(k), 0.0));
  const Tensor<float, 3> keys = cache.keys(s);
  EXPECT_TRUE(all_close(slice(keys, 0, 20), slice(stored<float, bfloat16>(k), 0, 20), 0.0));
  EXPECT_TRUE(all_close(slice(keys, 20, 3), stored<float, bfloat16>(more_k), 0.0));
  cache.truncate(s, 0);
  EXPECT_EQ(cache.length(s), 0);
  EXPECT_TRUE(cache.page_table(s).empty());
}

TEST(PagedKVCache, GrowKeepsEverySequence) {
  Random random(34);
  PagedKVCache<float, std::int8_t> cache({2, 1, 32, 0, 16});
  const Index s = cache.start();
  const Tensor<float, 3> k = rows<float>(random, 1, 32, 32), v = rows<float>(random, 1, 32, 32);
  cache.append(s, k, v);
  EXPECT_EQ(cache.free_pages(), 0);
  cache.grow(3);
  EXPECT_EQ(cache.pages(), 5);
  EXPECT_EQ(cache.free_pages(), 3);
  cache.append(s, slice(k, 0, 10), slice(v, 0, 10));
  const Tensor<float, 3> keys = cache.keys(s);
  EXPECT_TRUE(all_close(slice(keys, 0, 32), stored<float, std::int8_t>(k), 0.0));
  EXPECT_TRUE(all_close(slice(keys, 32, 10), stored<float, std::int8_t>(slice(k, 0, 10)), 0.0));
  // int8: a quarter of float's bytes, plus a bfloat16 scale per 32.
  EXPECT_EQ(cache.memory_bytes(), static_cast<std::size_t>(5 * 16 * 2 * (32 + 2)));
}

TEST(PagedKVCacheErrors, AreNamedAndLeaveTheCacheUnchanged) {
  Random random(41);
  expect_error<std::invalid_argument>(
      [] {
        PagedKVCache<float> bad({4, 1, 8, 0, 100});
      },
      {"PagedKVCache", "shape", "power of two", "100"});
  expect_error<std::invalid_argument>([] { PagedKVCache<float> bad({-1, 1, 8}); }, {"shape", "pages"});
  expect_error<std::invalid_argument>([] { PagedKVCache<float> bad({4, 0, 8}); }, {"shape", "kv_heads"});
  PagedKVCache<float> cache({2, 2, 8, 0, 16});
  const Index s = cache.start();
  expect_error<ShapeError>([&] { cache.append(s, rows<float>(random, 2, 3, 7), rows<float>(random, 2, 3, 8)); },
                           {"PagedKVCache::append", "keys"});
  expect_error<ShapeError>([&] { cache.append(s, rows<float>(random, 2, 3, 8), rows<float>(random, 2, 4, 8)); },
                           {"PagedKVCache::append", "values"});
  cache.append(s, rows<float>(random, 2, 20, 8), rows<float>(random, 2, 20, 8));
  const Tensor<float, 3> before = cache.keys(s);
  expect_error<std::length_error>(
      [&] { cache.append(s, rows<float>(random, 2, 13, 8), rows<float>(random, 2, 13, 8)); },
      {"PagedKVCache::append", "0 free pages", "needs 1"});
  EXPECT_EQ(cache.length(s), 20);
  EXPECT_TRUE(all_close(cache.keys(s), before, 0.0));
  const Index fork = cache.fork(s);
  expect_error<std::length_error>(
      [&] { cache.append(fork, rows<float>(random, 2, 1, 8), rows<float>(random, 2, 1, 8)); },
      {"needs 1"});  // the copy of the shared page
  EXPECT_EQ(cache.page_table(fork), cache.page_table(s));
  expect_error<std::invalid_argument>([&] { cache.truncate(s, 21); }, {"PagedKVCache::truncate", "length", "[0, 20]"});
  expect_error<std::invalid_argument>([&] { cache.grow(-1); }, {"PagedKVCache::grow", "more"});
  cache.end(fork);
  expect_error<std::invalid_argument>([&] { cache.end(fork); }, {"PagedKVCache::end", "sequence"});
  expect_error<std::invalid_argument>([&] { cache.fork(7); }, {"PagedKVCache::fork", "sequence", "7"});
  expect_error<std::invalid_argument>([&] { cache.length(-1); }, {"PagedKVCache::length", "sequence"});
}

TEST(PagedAttentionErrors, AreNamedAndWriteNothing) {
  Random random(42);
  PagedKVCache<float> cache({16, 2, 8, 0, 16});
  Grown<float, float> g = grow_sequences(cache, random, {5, 30});
  const Tensor<float, 4> q = random.normal_tensor<float, 4>({2, 4, 1, 8});
  Tensor<float, 4> out({2, 4, 1, 8});
  Tensor<float, 3> lse({2, 4, 1});
  out.fill(7.0f);
  AttentionWorkspace<float> ws;
  const auto call = [&](const Tensor<float, 4>& query, const std::vector<Index>& sequences,
                        const AttentionOptions<float>& opts) {
    paged_attention_into(query.view(), cache, sequences, out.view(), lse.view(), ws, opts);
  };
  expect_error<ShapeError>([&] { call(q, {g.ids[0]}, {}); }, {"paged_attention", "q"});
  expect_error<ShapeError>([&] { call(random.normal_tensor<float, 4>({2, 3, 1, 8}), g.ids, {}); }, {"q", "multiple"});
  expect_error<ShapeError>([&] { call(random.normal_tensor<float, 4>({2, 4, 1, 6}), g.ids, {}); }, {"q"});
  expect_error<ShapeError>(
      [&] {
        call(random.normal_tensor<float, 4>({2, 4, 17, 8}), g.ids, {});
      },
      {"q", "at most 16"});
  expect_error<std::invalid_argument>(
      [&] {
        call(random.normal_tensor<float, 4>({2, 4, 6, 8}), g.ids, {});
      },
      {"sequences[0]", "holds 5 tokens"});
  expect_error<std::invalid_argument>([&] { call(q, {g.ids[0], 9}, {}); }, {"sequences[1]", "live"});
  const auto refused = [&](const char* option, const auto& set) {
    AttentionOptions<float> opts;
    set(opts);
    expect_error<std::invalid_argument>([&] { call(q, g.ids, opts); }, {"paged_attention", option});
  };
  refused("opts.causal", [](AttentionOptions<float>& o) { o.causal = Causal::top_left; });
  refused("opts.key_lengths", [](AttentionOptions<float>& o) { o.key_lengths = {5, 5}; });
  refused("opts.dropout_p", [](AttentionOptions<float>& o) { o.dropout_p = 0.1f; });
  refused("opts.need_weights", [](AttentionOptions<float>& o) { o.need_weights = true; });
  refused("opts.kernel", [](AttentionOptions<float>& o) { o.kernel = Kernel::fused; });
  Tensor<float, 4> bias({1, 1, 1, 30});
  refused("opts.bias", [&](AttentionOptions<float>& o) { o.bias = bias.view(); });
  expect_error<ShapeError>(
      [&] {
        paged_attention_into(q.view(), cache, g.ids, TensorView<float, 4>(out.data(), {2, 4, 1, 7}), lse.view(), ws);
      },
      {"out"});
  for (Index n = 0; n < out.size(); ++n) EXPECT_EQ(out.data()[n], 7.0f);
}

/// x (B, L, E) rows [from, from + n) of batch b, as (1, n, E).
Tensor<double, 3> tokens_of(const Tensor<double, 3>& x, Index b, Index from, Index n) {
  Tensor<double, 3> out({1, n, x.dim(2)});
  for (Index l = 0; l < n; ++l)
    for (Index e = 0; e < x.dim(2); ++e) out(0, l, e) = x(b, from + l, e);
  return out;
}

TEST(PagedModuleStep, EqualsStepsOverOneKVCachePerSequence) {
  Random random(51);
  MultiHeadAttentionConfig cfg;
  cfg.embed_dim = 32;
  cfg.num_heads = 4;
  cfg.num_kv_heads = 2;
  cfg.rope_dim = 8;
  const MultiHeadAttention<double> mha(cfg, 5);
  PagedKVCache<double> pool({64, 2, 8, 0, 16});
  const std::vector<Index> prompts{20, 5, 37};
  const Tensor<double, 3> prompt = random.normal_tensor<double, 3>({3, 37, 32});
  std::vector<Index> ids;
  std::vector<KVCache<double>> caches;
  for (Index b = 0; b < 3; ++b) {  // prefill, 16 tokens at a time, one sequence per call
    ids.push_back(pool.start());
    caches.push_back(mha.make_cache(1));
    for (Index from = 0; from < prompts[static_cast<std::size_t>(b)]; from += 16) {
      const Index n = std::min<Index>(16, prompts[static_cast<std::size_t>(b)] - from);
      const Tensor<double, 3> x = tokens_of(prompt, b, from, n);
      EXPECT_TRUE(all_close(mha.step(x, pool, {ids.back()}), mha.step(x, caches.back()), 1e-12));
    }
  }
  // A fork of sequence 2, continued with the others.
  ids.push_back(pool.fork(ids[2]));
  caches.push_back(caches[2]);
  MhaWorkspace<double> ws;
  Tensor<double, 3> y({4, 1, 32});
  for (int step = 0; step < 20; ++step) {
    const Tensor<double, 3> x = random.normal_tensor<double, 3>({4, 1, 32});
    mha.step_into(x.view(), pool, ids, y.view(), ws);
    for (Index b = 0; b < 4; ++b) {
      const Tensor<double, 3> expected = mha.step(tokens_of(x, b, 0, 1), caches[static_cast<std::size_t>(b)]);
      EXPECT_TRUE(all_close(tokens_of(y, b, 0, 1), expected, 1e-12)) << "step " << step << ", sequence " << b;
    }
  }
  EXPECT_EQ(pool.length(ids[3]), 57);
  EXPECT_EQ(pool.length(ids[1]), 25);
}

TEST(PagedModuleStepErrors, AreNamedAndLeaveTheCacheUnchanged) {
  Random random(52);
  MultiHeadAttentionConfig cfg;
  cfg.embed_dim = 16;
  cfg.num_heads = 2;
  const MultiHeadAttention<float> mha(cfg, 1);
  PagedKVCache<float> pool({2, 2, 8, 0, 16});
  const Index a = pool.start(), b = pool.start();
  pool.append(a, rows<float>(random, 2, 10, 8), rows<float>(random, 2, 10, 8));
  const auto x = [&](Index batch, Index n) { return random.normal_tensor<float, 3>({batch, n, 16}); };
  expect_error<ShapeError>([&] { mha.step(x(1, 1), pool, {a, b}); }, {"MultiHeadAttention::step", "x_new"});
  expect_error<ShapeError>([&] { mha.step(x(1, 17), pool, {a}); }, {"x_new", "at most 16"});
  expect_error<std::invalid_argument>([&] { mha.step(x(2, 1), pool, {a, a}); }, {"sequences", "twice"});
  expect_error<std::invalid_argument>([&] { mha.step(x(1, 1), pool, {5}); }, {"sequences", "live"});
  PagedKVCache<float> other({2, 1, 8, 0, 16});
  const Index c = other.start();
  expect_error<ShapeError>([&] { mha.step(x(1, 1), other, {c}); }, {"cache", "2 key/value heads"});
  const Index fork = pool.fork(a);  // a's page is now shared: a step of both needs one copy, and b a page
  expect_error<std::length_error>([&] { mha.step(x(3, 1), pool, {a, b, fork}); }, {"needs 2 pages", "1 free"});
  EXPECT_EQ(pool.length(a), 10);
  EXPECT_EQ(pool.length(b), 0);
  EXPECT_EQ(pool.free_pages(), 1);
  EXPECT_EQ(pool.pages_needed({a, fork}, 1), 1);  // the second finds the page its own
  mha.step(x(2, 1), pool, {a, fork});
  EXPECT_EQ(pool.free_pages(), 0);
}

}  // namespace
}  // namespace selfattn::test
