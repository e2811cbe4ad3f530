// demo.cpp — a walk through selfattn on the sentence "the cat sat on the mat".
//
//   1. shapes: X (B, L, E) -> Q, K, V heads (B, H, L, D) -> output (B, L, E)
//   2. causal attention weights of one head, as a table and an ASCII heatmap (+ attention.svg)
//   3. masks: key padding and a sliding window, and which weights become exactly 0
//   4. permutation equivariance, and how positions break it
//   5. grouped-query attention: fewer key/value heads, same shapes, fewer parameters
//
// Usage: demo [svg-path]   (default: attention.svg in the current directory)
// Everything is deterministic: embeddings come from a hash of each word, weights from a fixed seed.
#include <selfattn/selfattn.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

using namespace selfattn;

namespace {

const std::vector<std::string> kWords{"the", "cat", "sat", "on", "the", "mat"};
constexpr Index kEmbed = 16;  // E
constexpr Index kHeads = 4;   // H, head dim D = 4
constexpr Index kShownHead = 0;

template <std::size_t R>
std::string shape(const std::array<Index, R>& s) {
  std::string text = "(";
  for (std::size_t d = 0; d < R; ++d) text += (d ? ", " : "") + std::to_string(s[d]);
  return text + ")";
}

// A fixed embedding table "seeded by the word": FNV-1a hash, then a SplitMix64 stream in [-1, 1).
std::vector<float> embed_word(const std::string& word) {
  std::uint64_t state = 1469598103934665603ULL;
  for (unsigned char c : word) state = (state ^ c) * 1099511628211ULL;
  std::vector<float> e(kEmbed);
  for (float& value : e) {
    std::uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    value = static_cast<float>(static_cast<double>((z ^ (z >> 31)) >> 11) * 0x1.0p-52 - 1.0);
  }
  return e;
}

// X (1, L, E): 2 * word embedding (+ sinusoidal position encoding when `positions`).
template <typename T = float>
Tensor<T, 3> embed_sentence(const std::vector<std::string>& words, bool positions) {
  const Index length = static_cast<Index>(words.size());
  const Tensor<T, 2> pe = sinusoidal_encoding<T>(length, kEmbed);
  Tensor<T, 3> x({1, length, kEmbed});
  for (Index l = 0; l < length; ++l) {
    const std::vector<float> e = embed_word(words[static_cast<std::size_t>(l)]);
    for (Index d = 0; d < kEmbed; ++d)
      x(0, l, d) = T(2) * e[static_cast<std::size_t>(d)] + (positions ? pe(l, d) : T(0));
  }
  return x;
}

// Weights of one head as a table: rows = queries, columns = keys; exact zeros print as a bare "0".
void print_table(const Tensor<float, 4>& w, Index head) {
  std::printf("%8s", "q \\ k");
  for (const std::string& word : kWords) std::printf("%6s", word.c_str());
  std::printf("\n");
  for (Index i = 0; i < w.dim(2); ++i) {
    std::printf("%8s", kWords[static_cast<std::size_t>(i)].c_str());
    for (Index j = 0; j < w.dim(3); ++j)
      w(0, head, i, j) == 0.0f ? std::printf("%6s", "0") : std::printf("%6.2f", static_cast<double>(w(0, head, i, j)));
    std::printf("\n");
  }
}

// One character per weight from " .:-=+*#%@" (0 -> ' ', any positive weight at least '.'), doubled for aspect.
void print_heatmap(const Tensor<float, 4>& w, Index head) {
  const char* ramp = " .:-=+*#%@";
  for (Index i = 0; i < w.dim(2); ++i) {
    std::printf("%8s |", kWords[static_cast<std::size_t>(i)].c_str());
    for (Index j = 0; j < w.dim(3); ++j) {
      const int level = std::clamp(static_cast<int>(std::ceil(w(0, head, i, j) * 9.0f)), 0, 9);
      std::printf("%c%c", ramp[level], ramp[level]);
    }
    std::printf("|\n");
  }
  std::printf("%8s  ", "");
  for (const std::string& word : kWords) std::printf("%c ", word[0]);
  std::printf("  (key initials; ' ' = 0, '@' = 1)\n");
}

double max_abs_diff(const Tensor<float, 3>& a, const Tensor<float, 3>& b) {
  double d = 0;
  for (Index n = 0; n < a.size(); ++n) d = std::max(d, std::abs(static_cast<double>(a.data()[n] - b.data()[n])));
  return d;
}

// MHA(P X) vs P MHA(X) for the reversed sentence, in double so that rounding shows as ~1e-16.
double reversal_difference(const MultiHeadAttention<double>& mha, bool positions) {
  const std::vector<std::string> reversed(kWords.rbegin(), kWords.rend());
  const Tensor<double, 3> x = embed_sentence<double>(kWords, positions);
  const Tensor<double, 3> x_rev = embed_sentence<double>(reversed, positions);
  const Tensor<double, 3> y = mha.forward(x).output, y_rev = mha.forward(x_rev).output;
  double d = 0;
  for (Index l = 0; l < y.dim(1); ++l)
    for (Index e = 0; e < kEmbed; ++e) d = std::max(d, std::abs(y_rev(0, l, e) - y(0, y.dim(1) - 1 - l, e)));
  return d;
}

Index parameter_count(const MhaParams<float>& p) {
  return p.q_weight.size() + p.k_weight.size() + p.v_weight.size() + p.out_weight.size() + p.q_bias.size() +
         p.k_bias.size() + p.v_bias.size() + p.out_bias.size();
}

}  // namespace

int main(int argc, char** argv) {
  const char* svg_path = argc > 1 ? argv[1] : "attention.svg";
  MultiHeadAttentionConfig cfg;
  cfg.embed_dim = kEmbed;
  cfg.num_heads = kHeads;
  const MultiHeadAttention<float> mha(cfg, 2024);
  const MhaParams<float>& P = mha.params();
  const Tensor<float, 3> x = embed_sentence(kWords, true);

  std::printf("== 1. Shapes: \"the cat sat on the mat\", E = %td, H = %td ==\n", kEmbed, kHeads);
  Tensor<float, 3> q = linear<float>(x, P.q_weight, P.q_bias), k = linear<float>(x, P.k_weight, P.k_bias),
                   v = linear<float>(x, P.v_weight, P.v_bias);
  const auto heads = sdpa_forward(split_heads(q, kHeads), split_heads(k, kHeads), split_heads(v, kHeads));
  const Tensor<float, 3> merged = merge_heads(heads.out);
  const Tensor<float, 3> by_hand = linear<float>(merged, P.out_weight, P.out_bias);
  std::printf("X = word embedding + sinusoidal position   (B, L, E)    %s\n", shape(x.shape()).c_str());
  std::printf("Q = X Wq^T + bq, split into heads           (B, H, L, D) %s\n",
              shape(split_heads(q, kHeads).shape()).c_str());
  std::printf("K, V likewise                               (B, H, L, D) %s\n",
              shape(split_heads(k, kHeads).shape()).c_str());
  std::printf("softmax(Q K^T / sqrt(D)) V per head         (B, H, L, D) %s\n", shape(heads.out.shape()).c_str());
  std::printf("heads merged (concatenated)                 (B, L, E)    %s\n", shape(merged.shape()).c_str());
  std::printf("output = merged Wo^T + bo                   (B, L, E)    %s\n", shape(by_hand.shape()).c_str());
  std::printf("these steps by hand vs mha.forward(x): max |difference| = %.1e\n\n",
              max_abs_diff(by_hand, mha.forward(x).output));

  std::printf("== 2. Causal attention weights of head %td (row: query, column: key) ==\n", kShownHead);
  AttentionOptions<float> causal;
  causal.causal = Causal::top_left;
  causal.need_weights = true;
  const Tensor<float, 4> w = mha.forward(x, causal).weights;
  print_table(w, kShownHead);
  std::printf("\n");
  print_heatmap(w, kShownHead);
  const std::string title = "\"the cat sat on the mat\": causal attention, head " + std::to_string(kShownHead);
  HeatmapOptions picture;  // selfattn/plot/heatmap.hpp: labels on both axes, a colour scale, masked cells hatched
  picture.title = title;
  picture.zero_is_masked = true;  // a causal forward gives its masked keys exactly 0
  try {
    write_attention_heatmap_svg(svg_path, w, 0, kShownHead, kWords, kWords, picture);
  } catch (const std::runtime_error&) {
    std::printf("could not write %s\n", svg_path);
    return 1;
  }
  std::printf("heatmap written to %s\n\n", svg_path);

  std::printf("== 3. Masks: a masked weight is exactly 0 (printed as a bare 0), the rest still sum to 1 ==\n");
  AttentionOptions<float> padded;
  padded.key_lengths = {4};  // treat "the mat" as padding: keys 4 and 5 are invalid for every query
  padded.need_weights = true;
  std::printf("key padding, key_lengths = {4} (no causal mask):\n");
  print_table(mha.forward(x, padded).weights, kShownHead);
  AttentionOptions<float> window = causal;
  window.window_left = 2;  // causal + sliding window: each token sees itself and the 2 tokens before it
  std::printf("causal sliding window, window_left = 2:\n");
  print_table(mha.forward(x, window).weights, kShownHead);
  std::printf("\n");

  std::printf("== 4. Permutation equivariance: reverse the sentence, compare MHA(P X) with P MHA(X) ==\n");
  const MultiHeadAttention<double> mha64(cfg, 2024);  // the same module in double
  std::printf("word embeddings only:         max |difference| = %.1e  (same outputs, reordered)\n",
              reversal_difference(mha64, false));
  std::printf("plus sinusoidal positions:    max |difference| = %.1e  (order now matters)\n\n",
              reversal_difference(mha64, true));

  std::printf("== 5. Grouped-query attention: H = %td query heads share Hkv key/value heads ==\n", kHeads);
  std::printf("%5s %14s %14s %12s %22s\n", "Hkv", "K, V heads", "output", "parameters", "KV cache floats/token");
  for (Index kv_heads : {kHeads, kHeads / 2, Index{1}}) {
    MultiHeadAttentionConfig gqa = cfg;
    gqa.num_kv_heads = kv_heads;
    const MultiHeadAttention<float> module(gqa, 2024);
    const Tensor<float, 3> kk = linear<float>(x, module.params().k_weight, module.params().k_bias);
    std::printf("%5td %14s %14s %12td %22td\n", kv_heads, shape(split_heads(kk, kv_heads).shape()).c_str(),
                shape(module.forward(x, causal).output.shape()).c_str(), parameter_count(module.params()),
                2 * kv_heads * module.head_dim());
  }
  std::printf("(Hkv = H is multi-head attention, Hkv = 1 multi-query attention)\n");
  return 0;
}
