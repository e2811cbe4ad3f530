// decode.cpp — generating a sequence token by token with a KV cache (MultiHeadAttention::make_cache and
// step), under each eviction policy: keep_all, sliding_window(W) and attention_sinks(S, W).
//
// The model is small and random: a fixed embedding table (vocab x E), one grouped-query attention layer
// (E = 256, H = 8 query heads, Hkv = 2 key/value heads, RoPE over the whole head dim 32) and a fixed readout
// to the vocabulary; the next token is the argmax of the readout of the layer's output (greedy decoding).
// The text it writes means nothing; the timings and the checks are the point. It prints:
//   1. a correctness check: a prompt prefilled in one step then tokens generated one at a time give the
//      rows of one causal forward over the whole sequence (exit code 1 if not);
//   2. per-token latency and cache memory as the sequence grows, per policy: keep_all grows with the
//      length, the windowed policies stay flat once the window is full (and their memory from the start);
//   3. one token with the cache against recomputing a causal forward over the whole sequence: O(N) vs O(N^2);
//   4. the eviction checks: the last token under a window equals one forward over the tokens the policy
//      kept, renumbered from position 0 (positions within the cache, docs/decoding.md);
//   5. a float and a bfloat16 cache side by side at the size of a real model's layer (E = 1024, H = Hkv = 8,
//      head dim 128, 32k cached tokens): tokens per second, cache memory (memory_bytes and the resident memory
//      a 64k-token cache adds), and the largest difference between the two caches' outputs. Exit 1 unless the
//      16-bit cache takes half the bytes and its outputs stay within bfloat16 rounding of the float cache's; and
//      with the projection weights in bfloat16 too (params_cast, step_into_with), every byte a step reads is 16-bit;
//      and an int8 cache (make_cache<std::int8_t>: a bfloat16 scale per block of 32, docs/int8_cache.md) beside them:
//      exit 1 unless it takes 17/64 of the float cache's bytes and its outputs stay within twice the bfloat16
//      cache's allowance (an int8 step is absmax / 127 of its block, about a bfloat16 rounding of the block's largest
//      value, where bfloat16 rounds each element relative to itself).
//      `--quick` (what ctest runs): 4k cached tokens and an 8k-token cache measured, instead of 32k and 64k;
//   6. a whole decoder (4 GPT-style layers of E = 1024 and a final norm, TransformerStack) with float parameters,
//      caches and tokens against bfloat16 parameters, caches and tokens in and out (params_cast,
//      TransformerStack::step_with on a bfloat16 token: widened on entry, the output rounded once) over 8k
//      cached tokens per layer (1k with --quick): tokens per second, MiB of weights and caches, the largest
//      difference of the outputs. Exit 1 unless bfloat16 takes exactly half the bytes and the outputs agree to a
//      few bfloat16 roundings per layer.
// Latencies are medians over a few tokens (the machine may be busy with other work); they include the
// embedding lookup, the step, the readout and the argmax.
#include <selfattn/selfattn.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <utility>
#include <vector>

using namespace selfattn;

namespace {

// Sizes. The test suite runs every example, Debug (-O0) builds included, where Eigen is some 20-50x slower:
// without optimisation the sequences are shorter, so that the run stays at a few seconds either way.
// __OPTIMIZE__ is defined by g++ and clang++ from -O1 up (NDEBUG would not do: -O2 without it is common);
// other compilers get the small sizes.
#ifdef __OPTIMIZE__
constexpr Index longest = 4096;  // tokens generated per policy (the last row of the latency table)
constexpr Index window = 256;    // W of sliding_window(W); attention_sinks(S, W - S) keeps as many tokens
const std::vector<Index> recompute_lengths = {128, 256, 512, 1024};
constexpr Index half_cache_tokens = 32768;      // section 5: tokens in the float and bfloat16 caches
constexpr Index resident_cache_tokens = 65536;  // section 5: the cache whose resident memory is measured
constexpr Index quick_divisor = 8;              // --quick: both sizes / 8
constexpr Index decoder_embed = 1024, decoder_layers = 4;  // section 6: the decoder (F = 4E)
constexpr Index decoder_cache_tokens = 8192;               // section 6: tokens in every layer's cache
#else
constexpr Index longest = 512;
constexpr Index window = 64;
const std::vector<Index> recompute_lengths = {32, 128};
constexpr Index half_cache_tokens = 2048;
constexpr Index resident_cache_tokens = 4096;
constexpr Index quick_divisor = 1;
constexpr Index decoder_embed = 256, decoder_layers = 2;
constexpr Index decoder_cache_tokens = 512;
#endif
constexpr Index embed_dim = 256, heads = 8, kv_heads = 2, vocab = 64, sinks = 4;
constexpr Index timed_tokens = 15;  // latency at length N: the median of the steps that reach N .. N + 14
constexpr double tolerance = 1e-4;  // float, outputs of order 1

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

double microseconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
}

/// Embedding, one attention layer, readout; random and fixed.
struct Model {
  MultiHeadAttention<float> attention;
  Tensor<float, 2> embedding{{vocab, embed_dim}};  // row t: the input vector of token t
  Tensor<float, 2> readout{{vocab, embed_dim}};    // logits = readout * output row

  static MultiHeadAttentionConfig config() {
    MultiHeadAttentionConfig cfg;
    cfg.embed_dim = embed_dim;
    cfg.num_heads = heads;
    cfg.num_kv_heads = kv_heads;      // grouped-query: the cache stores 2 heads, not 8
    cfg.rope_dim = embed_dim / heads;  // RoPE on the full head dim (32)
    return cfg;
  }

  Model() : attention(config(), 7) {
    std::mt19937 random(2024);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (Index n = 0; n < embedding.size(); ++n) embedding.data()[n] = normal(random);
    for (Index n = 0; n < readout.size(); ++n) readout.data()[n] = normal(random);
  }

  /// The inputs (1, L, E) of a token sequence.
  Tensor<float, 3> embed(const std::vector<int>& tokens, std::size_t begin, std::size_t end) const {
    Tensor<float, 3> x({1, static_cast<Index>(end - begin), embed_dim});
    for (std::size_t l = begin; l < end; ++l)
      as_vector(x[0][static_cast<Index>(l - begin)]) = as_vector(embedding.view()[tokens[l]]);
    return x;
  }

  /// Greedy: the token whose readout row scores row `row` of y (1, L, E) highest.
  int next_token(const Tensor<float, 3>& y, Index row) const {
    const Eigen::Matrix<float, Eigen::Dynamic, 1> logits = as_matrix(readout.view()) * as_vector(y.view()[0][row]).transpose();
    Index best = 0;
    logits.maxCoeff(&best);
    return static_cast<int>(best);
  }
};

/// Max |a - b| over two (1, L, E) tensors (or their rows [a_row, a_row + rows), [b_row, ...)).
double max_difference(const Tensor<float, 3>& a, Index a_row, const Tensor<float, 3>& b, Index b_row, Index rows) {
  double worst = 0;
  for (Index l = 0; l < rows; ++l)
    for (Index e = 0; e < embed_dim; ++e)
      worst = std::max(worst, std::abs(static_cast<double>(a(0, a_row + l, e)) - static_cast<double>(b(0, b_row + l, e))));
  return worst;
}

Tensor<float, 3> causal_forward(const Model& model, const Tensor<float, 3>& x) {
  AttentionOptions<float> causal;
  causal.causal = Causal::top_left;
  return model.attention.forward(x, causal).output;
}

// ---- 1. correctness -------------------------------------------------------------------------------------

/// A prompt of 5 tokens prefilled in one step, then 11 tokens one at a time, against one causal forward.
bool check_against_forward(const Model& model) {
  std::vector<int> tokens = {1, 2, 3, 4, 5};
  auto cache = model.attention.make_cache(1);
  std::vector<Tensor<float, 3>> outputs{model.attention.step(model.embed(tokens, 0, tokens.size()), cache)};
  tokens.push_back(model.next_token(outputs.back(), 4));
  while (tokens.size() < 17) {
    outputs.push_back(model.attention.step(model.embed(tokens, tokens.size() - 1, tokens.size()), cache));
    tokens.push_back(model.next_token(outputs.back(), 0));
  }
  tokens.pop_back();  // generated but not fed: 16 inputs (5 + 11), 16 output rows
  const Tensor<float, 3> expected = causal_forward(model, model.embed(tokens, 0, tokens.size()));
  double worst = max_difference(outputs[0], 0, expected, 0, 5);
  for (std::size_t t = 1; t < outputs.size(); ++t)
    worst = std::max(worst, max_difference(outputs[t], 0, expected, static_cast<Index>(4 + t), 1));
  std::string text;
  for (int token : tokens) text += std::to_string(token) + " ";
  std::printf("tokens: %s(prompt 1 2 3 4 5, then greedy)\n", text.c_str());
  std::printf("prefill of 5 tokens + 11 single-token steps vs one causal forward over the 16: max |difference| = %.2e %s\n",
              worst, worst <= tolerance ? "(ok)" : "(FAILED)");
  return worst <= tolerance;
}

// ---- 2. generation under a policy -------------------------------------------------------------------------

struct Generation {
  std::string name;
  CachePolicy policy;
  KVCache<float> cache;
  std::vector<int> tokens;          // tokens[0] is the start token; tokens[t] is fed at step t
  std::vector<double> step_us;      // step_us[t]: the token fed at step t
  std::vector<std::size_t> bytes;   // cache.memory_bytes() after step t
  Tensor<float, 3> last_output;     // (1, 1, E) of the last step
};

/// One token of a generation: feed the last token, read the next one out.
void generate_one(const Model& model, Generation& g) {
  const auto start = std::chrono::steady_clock::now();
  const std::size_t last = g.tokens.size() - 1;
  g.last_output = model.attention.step(model.embed(g.tokens, last, last + 1), g.cache);
  g.tokens.push_back(model.next_token(g.last_output, 0));
  g.step_us.push_back(microseconds_since(start));
  g.bytes.push_back(g.cache.memory_bytes());
}

/// Each policy generates its own sequence from the start token; the policies take turns token by token, so
/// that a busy moment of the machine slows them alike.
std::vector<Generation> generate_all(const Model& model, const std::vector<std::pair<std::string, CachePolicy>>& policies,
                                     Index steps) {
  std::vector<Generation> runs;
  for (const auto& [name, policy] : policies)
    runs.push_back(Generation{name, policy, model.attention.make_cache(1, policy), {0}, {}, {}, {}});
  for (Index t = 0; t < steps; ++t)
    for (Generation& g : runs) generate_one(model, g);
  for (Generation& g : runs) g.tokens.pop_back();  // generated but not fed
  return runs;
}

/// Median latency of the steps at which the sequence reaches lengths n .. n + timed_tokens - 1.
double latency_at(const Generation& g, Index n) {
  const auto begin = g.step_us.begin() + (n - 1);
  return median(std::vector<double>(begin, begin + timed_tokens));
}

void print_latency_table(const std::vector<Generation>& runs) {
  std::printf("\n%-8s", "tokens");
  for (const Generation& g : runs) std::printf(" | %24s", g.name.c_str());
  std::printf("\n%-8s", "so far");
  for (std::size_t r = 0; r < runs.size(); ++r) std::printf(" | %11s %12s", "us/token", "cache KiB");
  std::printf("\n--------");
  for (std::size_t r = 0; r < runs.size(); ++r) std::printf("-+-------------------------");
  std::printf("\n");
  for (Index n = 1; n <= longest; n *= 2) {
    std::printf("%8td", n);
    for (const Generation& g : runs)
      std::printf(" | %11.1f %12.1f", latency_at(g, n), static_cast<double>(g.bytes[static_cast<std::size_t>(n - 1)]) / 1024);
    std::printf("\n");
  }
  const Index from = window;  // the windowed policies are full from here on
  std::printf("latency at %td tokens / at %td:", longest, from);
  for (const Generation& g : runs) std::printf("  %s %.2fx", g.name.c_str(), latency_at(g, longest) / latency_at(g, from));
  std::printf("\n");
}

// ---- 3. cache vs recompute --------------------------------------------------------------------------------

/// One generated token at sequence length n: a step over a cache holding n - 1 tokens, or a causal forward
/// over all n (whose last row is that token's output). Returns false if the two outputs differ.
bool compare_with_recompute(const Model& model, const std::vector<int>& tokens) {
  std::printf("\n%8s | %14s | %16s | %9s | %s\n", "length N", "step, us", "recompute, us", "ratio", "max |difference|");
  std::printf("---------+----------------+------------------+-----------+-----------------\n");
  bool ok = true;
  for (Index n : recompute_lengths) {
    const Tensor<float, 3> x = model.embed(tokens, 0, static_cast<std::size_t>(n));
    auto prefilled = model.attention.make_cache(1, CachePolicy::keep_all(n));  // fixed capacity: no growth in the timed step
    model.attention.step(model.embed(tokens, 0, static_cast<std::size_t>(n - 1)), prefilled);
    const Tensor<float, 3> last = model.embed(tokens, static_cast<std::size_t>(n - 1), static_cast<std::size_t>(n));
    std::vector<double> step_us, recompute_us;
    Tensor<float, 3> stepped, full;
    for (int r = 0; r < 7; ++r) {
      auto cache = prefilled;  // a copy, outside the timing
      const auto start = std::chrono::steady_clock::now();
      stepped = model.attention.step(last, cache);
      step_us.push_back(microseconds_since(start));
    }
    for (int r = 0; r < 3; ++r) {
      const auto start = std::chrono::steady_clock::now();
      full = causal_forward(model, x);
      recompute_us.push_back(microseconds_since(start));
    }
    const double difference = max_difference(stepped, 0, full, n - 1, 1);
    ok = ok && difference <= tolerance;
    const double step = median(step_us), recompute = median(recompute_us);
    std::printf("%8td | %14.1f | %16.1f | %8.0fx | %.2e\n", n, step, recompute, recompute / step, difference);
  }
  std::printf("(step: median of 7, recompute: median of 3; the step reads N cached keys, the recompute does\n"
              " N^2/2 query-key pairs and projects all N tokens again)\n");
  return ok;
}

// ---- 4. eviction --------------------------------------------------------------------------------------------

/// The last token under a windowed policy against one causal forward over the tokens the policy kept (the
/// first `sink_tokens`, then the last `window`), which numbers them from position 0.
bool check_eviction(const Model& model, const Generation& g) {
  const std::size_t total = g.tokens.size(), sink_count = static_cast<std::size_t>(g.policy.sink_tokens);
  const std::size_t kept_window = static_cast<std::size_t>(g.policy.window);
  std::vector<int> kept(g.tokens.begin(), g.tokens.begin() + static_cast<std::ptrdiff_t>(sink_count));
  kept.insert(kept.end(), g.tokens.end() - static_cast<std::ptrdiff_t>(kept_window), g.tokens.end());
  const Tensor<float, 3> expected = causal_forward(model, model.embed(kept, 0, kept.size()));
  const double difference = max_difference(g.last_output, 0, expected, static_cast<Index>(kept.size()) - 1, 1);
  std::printf("%-24s token %zu vs one forward over the %zu kept tokens at positions 0..%zu: max |difference| = %.2e %s\n",
              g.name.c_str(), total - 1, kept.size(), kept.size() - 1, difference,
              difference <= tolerance ? "(ok)" : "(FAILED)");
  return difference <= tolerance;
}

/// The first step at which b's generated token differs from a's, or -1.
Index first_divergence(const Generation& a, const Generation& b) {
  for (std::size_t t = 0; t < a.tokens.size() && t < b.tokens.size(); ++t)
    if (a.tokens[t] != b.tokens[t]) return static_cast<Index>(t);
  return -1;
}

// ---- 5. float, bfloat16 and int8 caches ---------------------------------------------------------------------------

/// Resident memory of this process in bytes (Linux /proc/self/statm), or -1 where it cannot be read.
double resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  double total_pages = 0, resident_pages = -1;
  if (!(statm >> total_pages >> resident_pages)) return -1;
  return resident_pages * 4096.0;
}

/// Resident memory a freshly made cache of `tokens` token slots adds (its planes are zero-filled, so every page is
/// touched), and its memory_bytes().
template <typename S>
std::pair<double, std::size_t> cache_footprint(const MultiHeadAttention<float>& layer, Index tokens) {
  const double before = resident_bytes();
  const KVCache<float, S> cache = layer.make_cache<S>(1, CachePolicy::keep_all(tokens));
  const double after = resident_bytes();
  return {before < 0 ? -1.0 : after - before, cache.memory_bytes()};
}

/// The two caches side by side on one layer of a real model's size: the same cached keys and values (random,
/// appended directly: a prefill would only make them meaningful, not faster to read), the same new tokens.
bool compare_cache_storage_types(Index cached_tokens, Index measured_tokens) {
  constexpr Index big_heads = 8, head_dim = 128, big_embed = big_heads * head_dim, timed = 25;
  MultiHeadAttentionConfig cfg;
  cfg.embed_dim = big_embed;
  cfg.num_heads = big_heads;
  cfg.num_kv_heads = big_heads;
  cfg.rope_dim = head_dim;
  const MultiHeadAttention<float> layer(cfg, 11);
  const CachePolicy policy = CachePolicy::keep_all(cached_tokens + timed);
  KVCache<float> wide = layer.make_cache(1, policy);
  KVCache<float, bfloat16> half = layer.make_cache<bfloat16>(1, policy);
  // The third: a bfloat16 cache and bfloat16 projection weights (every byte a step reads is 16-bit).
  KVCache<float, bfloat16> all_half = layer.make_cache<bfloat16>(1, policy);
  const MhaParams<bfloat16> half_weights = params_cast<bfloat16>(layer.params());
  KVCache<float, std::int8_t> int8 = layer.make_cache<std::int8_t>(1, policy);
  std::mt19937 random(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const Index chunk = 1024;
  Tensor<float, 3> keys({big_heads, chunk, head_dim}), values({big_heads, chunk, head_dim});
  for (Index filled = 0; filled < cached_tokens; filled += chunk) {
    for (Tensor<float, 3>* t : {&keys, &values})
      for (Index n = 0; n < t->size(); ++n) t->data()[n] = normal(random);
    wide.append(0, keys, values);  // the float cache stores them as they are,
    half.append(0, keys, values);  // the bfloat16 cache rounds each once
    all_half.append(0, keys, values);
    int8.append(0, keys, values);  // the int8 cache quantises each row, a scale per block of 32
  }
  // Tokens per second over the same new tokens, the two caches taking turns (a busy moment slows both alike).
  Tensor<float, 3> token({1, 1, big_embed}), out_wide({1, 1, big_embed}), out_half({1, 1, big_embed});
  Tensor<float, 3> out_all_half({1, 1, big_embed}), out_int8({1, 1, big_embed});
  std::vector<double> wide_us, half_us, all_half_us, int8_us;
  double worst = 0, worst_all_half = 0, worst_int8 = 0, scale = 0;
  for (Index t = 0; t < timed; ++t) {
    for (Index n = 0; n < token.size(); ++n) token.data()[n] = normal(random);
    auto start = std::chrono::steady_clock::now();
    layer.step_into(token, wide, out_wide.view());
    wide_us.push_back(microseconds_since(start));
    start = std::chrono::steady_clock::now();
    layer.step_into(token, half, out_half.view());
    half_us.push_back(microseconds_since(start));
    start = std::chrono::steady_clock::now();
    layer.step_into_with(half_weights, token, all_half, out_all_half.view());
    all_half_us.push_back(microseconds_since(start));
    start = std::chrono::steady_clock::now();
    layer.step_into(token, int8, out_int8.view());
    int8_us.push_back(microseconds_since(start));
    for (Index n = 0; n < out_wide.size(); ++n) {
      worst = std::max(worst, std::abs(static_cast<double>(out_half.data()[n]) - out_wide.data()[n]));
      worst_all_half = std::max(worst_all_half, std::abs(static_cast<double>(out_all_half.data()[n]) - out_wide.data()[n]));
      worst_int8 = std::max(worst_int8, std::abs(static_cast<double>(out_int8.data()[n]) - out_wide.data()[n]));
      scale = std::max(scale, std::abs(static_cast<double>(out_wide.data()[n])));
    }
  }
  const double wide_rate = 1e6 / median(wide_us), half_rate = 1e6 / median(half_us);
  const double all_half_rate = 1e6 / median(all_half_us), int8_rate = 1e6 / median(int8_us);
  const auto [wide_resident, wide_bytes] = cache_footprint<float>(layer, measured_tokens);
  const auto [half_resident, half_bytes] = cache_footprint<bfloat16>(layer, measured_tokens);
  const auto [int8_resident, int8_bytes] = cache_footprint<std::int8_t>(layer, measured_tokens);
  const double mib = 1024.0 * 1024.0;
  std::printf("layer: E = %td, H = Hkv = %td, head dim %td; %td cached tokens, then %td new ones (median)\n", big_embed,
              big_heads, head_dim, cached_tokens, timed);
  std::printf("(the last two columns: a fresh cache of %td token slots, its memory_bytes() and the resident memory it "
              "adds)\n", measured_tokens);
  std::printf("%-10s | %10s | %14s | %22s | %24s\n", "cache", "tokens/s", "cache MiB", "empty cache MiB",
              "empty cache resident MiB");
  std::printf("-----------+------------+----------------+------------------------+-------------------------\n");
  std::printf("%-10s | %10.1f | %14.1f | %22.1f | %24.1f\n", "float", wide_rate, wide.memory_bytes() / mib,
              wide_bytes / mib, wide_resident / mib);
  std::printf("%-10s | %10.1f | %14.1f | %22.1f | %24.1f\n", "bfloat16", half_rate, half.memory_bytes() / mib,
              half_bytes / mib, half_resident / mib);
  std::printf("%-10s | %10.1f | %14.1f |  (a bfloat16 cache, and the projection weights in bfloat16 too)\n",
              "+ weights", all_half_rate, all_half.memory_bytes() / mib);
  std::printf("%-10s | %10.1f | %14.1f | %22.1f | %24.1f\n", "int8", int8_rate, int8.memory_bytes() / mib,
              int8_bytes / mib, int8_resident / mib);
  std::printf("bfloat16 / float: %.2fx the tokens per second, %.3fx the bytes (%td-token caches %.3fx resident)\n",
              half_rate / wide_rate, static_cast<double>(half.memory_bytes()) / wide.memory_bytes(),
              measured_tokens, half_resident / wide_resident);
  std::printf("bfloat16 cache and weights / float: %.2fx the tokens per second (weights: %.1f MiB read per token, "
              "against %.1f)\n", all_half_rate / wide_rate, 2.0 * 4 * big_embed * big_embed / mib,
              4.0 * 4 * big_embed * big_embed / mib);
  // The cached keys and values are rounded to 8 significant bits: outputs (of order `scale`) move by a few
  // bfloat16 roundings at most, far below anything a model reads off them.
  const double allowed = 4.0 * std::ldexp(1.0, -8) * scale;
  std::printf("max |output difference| over the %td tokens: %.2e (largest |output| %.2f; allowed %.2e) %s\n", timed,
              worst, scale, allowed, worst <= allowed ? "(ok)" : "(FAILED)");
  // Weights rounded to 8 significant bits move each projection by about a bfloat16 rounding of its output: the
  // layer's output by a few more of them.
  const double allowed_all_half = 2.0 * allowed;
  std::printf("with bfloat16 weights too: max |output difference| %.2e (allowed %.2e) %s\n", worst_all_half,
              allowed_all_half, worst_all_half <= allowed_all_half ? "(ok)" : "(FAILED)");
  const bool half_the_bytes = 2 * half.memory_bytes() == wide.memory_bytes() && 2 * half_bytes == wide_bytes;
  std::printf("the bfloat16 cache holds exactly half the bytes: %s\n", half_the_bytes ? "(ok)" : "(FAILED)");
  std::printf(
      "int8 / float: %.2fx the tokens per second, %.3fx the bytes; int8 / bfloat16: %.2fx the tokens per "
      "second\n",
      int8_rate / wide_rate, static_cast<double>(int8.memory_bytes()) / wide.memory_bytes(), int8_rate / half_rate);
  // An int8 step is absmax / 127 of its block of 32: about a bfloat16 rounding of the block's largest value.
  const double allowed_int8 = 2.0 * allowed;
  std::printf("int8 cache: max |output difference| %.2e (allowed %.2e) %s\n", worst_int8, allowed_int8,
              worst_int8 <= allowed_int8 ? "(ok)" : "(FAILED)");
  // 128 int8 values and 4 bfloat16 scales per row against 128 floats: 136 / 512 = 17 / 64.
  const bool int8_bytes_ok = 64 * int8.memory_bytes() == 17 * wide.memory_bytes() && 64 * int8_bytes == 17 * wide_bytes;
  std::printf("the int8 cache holds exactly 17/64 of the float cache's bytes: %s\n",
              int8_bytes_ok ? "(ok)" : "(FAILED)");
  return worst <= allowed && worst_all_half <= allowed_all_half && half_the_bytes && worst_int8 <= allowed_int8 &&
         int8_bytes_ok;
}

// ---- 6. a whole decoder in 16 bits -----------------------------------------------------------------------------

/// Bytes of every weight matrix and vector of a stack's parameters stored as P.
template <typename P>
double parameter_bytes(const TransformerStackParams<P>& p) {
  double elements = static_cast<double>(p.norm_weight.size() + p.norm_bias.size());
  for (const TransformerLayerParams<P>& l : p.layers) {
    for (const Tensor<P, 2>* w : {&l.self_attn.q_weight, &l.self_attn.k_weight, &l.self_attn.v_weight,
                                  &l.self_attn.out_weight, &l.linear1_weight, &l.linear2_weight})
      elements += static_cast<double>(w->size());
    for (const Tensor<P, 1>* b : {&l.self_attn.q_bias, &l.self_attn.k_bias, &l.self_attn.v_bias, &l.self_attn.out_bias,
                                  &l.linear1_bias, &l.linear2_bias, &l.norm1_weight, &l.norm1_bias, &l.norm2_weight,
                                  &l.norm2_bias})
      elements += static_cast<double>(b->size());
  }
  return elements * sizeof(P);
}

/// A GPT-style decoder (decoder_layer_config: pre-norm, GELU, RoPE; a final norm) run two ways on the same tokens: float
/// parameters, caches and activations (step), and everything a caller holds in bfloat16: parameters, caches, the token
/// in and the output (params_cast, step_with on a Tensor<bfloat16, 3>). Every layer's cache holds the same
/// `cached_tokens` random keys and values (appended directly).
bool compare_float_and_bfloat16_decoder(Index cached_tokens) {
  constexpr Index decoder_heads = 8, timed = 25;
  TransformerStackConfig cfg;
  cfg.layer = decoder_layer_config(decoder_embed, decoder_heads);
  cfg.layer.attention.rope_dim = decoder_embed / decoder_heads;
  cfg.num_layers = decoder_layers;
  cfg.final_norm = true;
  const TransformerStack<float> model(cfg, 13);
  const TransformerStackParams<bfloat16> half_weights = params_cast<bfloat16>(model.params());
  const CachePolicy policy = CachePolicy::keep_all(cached_tokens + timed);
  TransformerStackCache<float> wide = model.make_cache(1, policy);
  TransformerStackCache<float, bfloat16> half = model.make_cache<bfloat16>(1, policy);
  std::mt19937 random(6);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const Index head_dim = decoder_embed / decoder_heads;
  Tensor<float, 3> keys({decoder_heads, cached_tokens, head_dim}), values({decoder_heads, cached_tokens, head_dim});
  for (Index layer = 0; layer < decoder_layers; ++layer) {
    for (Tensor<float, 3>* t : {&keys, &values})
      for (Index n = 0; n < t->size(); ++n) t->data()[n] = normal(random);
    wide.layers[static_cast<std::size_t>(layer)].append(0, keys, values);
    half.layers[static_cast<std::size_t>(layer)].append(0, keys, values);
  }
  Tensor<float, 3> token({1, 1, decoder_embed});
  std::vector<double> wide_us, half_us;
  double worst = 0, scale = 0;
  for (Index t = 0; t < timed; ++t) {
    for (Index n = 0; n < token.size(); ++n) token.data()[n] = normal(random);
    auto start = std::chrono::steady_clock::now();
    const Tensor<float, 3> out_wide = model.step(token, wide);
    wide_us.push_back(microseconds_since(start));
    const Tensor<bfloat16, 3> token_half = tensor_cast<bfloat16>(token);  // the caller's 16-bit embedding
    start = std::chrono::steady_clock::now();
    const Tensor<bfloat16, 3> out_half = model.step_with(half_weights, token_half, half);
    half_us.push_back(microseconds_since(start));
    for (Index n = 0; n < out_wide.size(); ++n) {
      worst = std::max(worst, std::abs(static_cast<double>(out_half.data()[n]) - out_wide.data()[n]));
      scale = std::max(scale, std::abs(static_cast<double>(out_wide.data()[n])));
    }
  }
  const double wide_rate = 1e6 / median(wide_us), half_rate = 1e6 / median(half_us), mib = 1024.0 * 1024.0;
  const double wide_weights = parameter_bytes(model.params()), half_weight_bytes = parameter_bytes(half_weights);
  std::printf("decoder: %td layers of E = %td, H = %td, F = %td (GELU, pre-norm, RoPE), a final norm; %td cached "
              "tokens per layer, then %td new ones (median)\n",
              decoder_layers, decoder_embed, decoder_heads, 4 * decoder_embed, cached_tokens, timed);
  std::printf("%-22s | %10s | %12s | %12s\n", "weights, caches, tokens", "tokens/s", "weights MiB", "caches MiB");
  std::printf("-----------------------+------------+--------------+-------------\n");
  std::printf("%-22s | %10.1f | %12.1f | %12.1f\n", "float", wide_rate, wide_weights / mib, wide.memory_bytes() / mib);
  std::printf("%-22s | %10.1f | %12.1f | %12.1f\n", "bfloat16", half_rate, half_weight_bytes / mib,
              half.memory_bytes() / mib);
  std::printf("bfloat16 / float: %.2fx the tokens per second, %.3fx the bytes of weights and caches\n",
              half_rate / wide_rate,
              (half_weight_bytes + static_cast<double>(half.memory_bytes())) /
                  (wide_weights + static_cast<double>(wide.memory_bytes())));
  // Every weight, cached value, input and output rounded to 8 significant bits: each layer's output moves by a few
  // bfloat16 roundings of its size, and the layers add them up (the final norm keeps the outputs of order 1).
  const double allowed = static_cast<double>(decoder_layers) * 4.0 * std::ldexp(1.0, -8) * scale;
  std::printf("max |output difference| over the %td tokens: %.2e (largest |output| %.2f; allowed %.2e) %s\n", timed,
              worst, scale, allowed, worst <= allowed ? "(ok)" : "(FAILED)");
  const bool half_the_bytes = 2.0 * half_weight_bytes == wide_weights && 2 * half.memory_bytes() == wide.memory_bytes();
  std::printf("bfloat16 weights and caches hold exactly half the bytes: %s\n", half_the_bytes ? "(ok)" : "(FAILED)");
  return worst <= allowed && half_the_bytes;
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::string(argv[1]) == "--quick";
  if (argc > 2 || (argc == 2 && !quick)) {
    std::fprintf(stderr, "usage: %s [--quick]\n", argv[0]);
    return 2;
  }
  const Model model;
  std::printf("model: E = %td, H = %td query heads, Hkv = %td key/value heads (head dim %td, RoPE on all of it), "
              "vocabulary %td, random weights, greedy decoding\n\n",
              embed_dim, heads, kv_heads, embed_dim / heads, vocab);

  std::printf("== 1. the cache gives the same outputs as one causal forward\n");
  bool ok = check_against_forward(model);

  std::printf("\n== 2. per-token latency as the sequence grows (median of %td tokens at each length)\n", timed_tokens);
  const Index steps = longest + timed_tokens - 1;
  const std::vector<Generation> runs =
      generate_all(model,
                   {{"keep_all", CachePolicy::keep_all()},
                    {"sliding_window(" + std::to_string(window) + ")", CachePolicy::sliding_window(window)},
                    {"attention_sinks(" + std::to_string(sinks) + ", " + std::to_string(window - sinks) + ")",
                     CachePolicy::attention_sinks(sinks, window - sinks)}},
                   steps);
  print_latency_table(runs);
  for (const Generation& g : runs)
    std::printf("%-24s after %zu tokens: cache.length() = %td, memory_bytes() = %zu\n", g.name.c_str(), g.tokens.size(),
                g.cache.length(), g.cache.memory_bytes());
  for (std::size_t r = 1; r < runs.size(); ++r) {
    const Index t = first_divergence(runs[0], runs[r]);
    if (t < 0)
      std::printf("%s generated the same tokens as keep_all\n", runs[r].name.c_str());
    else
      std::printf("%s: the same first %td tokens as keep_all (the first eviction comes with token %td), then its own\n",
                  runs[r].name.c_str(), t, window + 1);
  }

  std::printf("\n== 3. one token with the cache vs recomputing the whole sequence\n");
  ok = compare_with_recompute(model, runs[0].tokens) && ok;

  std::printf("\n== 4. eviction keeps the tokens its policy names, at positions within the cache\n");
  ok = check_eviction(model, runs[1]) && ok;
  ok = check_eviction(model, runs[2]) && ok;

  std::printf("\n== 5. a float and a bfloat16 cache side by side\n");
  const Index divisor = quick ? quick_divisor : 1;
  ok = compare_cache_storage_types(half_cache_tokens / divisor, resident_cache_tokens / divisor) && ok;

  std::printf("\n== 6. a whole decoder in bfloat16: weights, caches, tokens in and out\n");
  ok = compare_float_and_bfloat16_decoder(decoder_cache_tokens / divisor) && ok;

  std::printf("\n%s\n", ok ? "all checks passed" : "A CHECK FAILED");
  return ok ? 0 : 1;
}
