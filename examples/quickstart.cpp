// quickstart.cpp — the shortest useful selfattn program: causal self-attention with a
// MultiHeadAttention module, then the bare scaled dot-product attention on (B, H, L, D) tensors.
// Writes quickstart_attention.svg (every head's weights as a heatmap) and quickstart_attention.csv (head 0)
// in the current directory.
#include <selfattn/selfattn.hpp>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

using namespace selfattn;

int main() {
  MultiHeadAttentionConfig cfg;
  cfg.embed_dim = 16;  // E
  cfg.num_heads = 4;   // H, head dim D = E / H = 4
  MultiHeadAttention<float> mha(cfg);

  // x (B=1, L=6, E=16): deterministic "random-ish" values.
  Tensor<float, 3> x({1, 6, 16});
  for (Index l = 0; l < 6; ++l)
    for (Index e = 0; e < 16; ++e) x(0, l, e) = std::sin(static_cast<float>(7 * l + 13 * e + 10) / 10.0f);

  AttentionOptions<float> opts;
  opts.causal = Causal::top_left;  // token l sees tokens 0..l
  opts.need_weights = true;
  auto fwd = mha.forward(x, opts);  // self-attention: query = key = value = x
  std::printf("output: (%td, %td, %td)\n", fwd.output.dim(0), fwd.output.dim(1), fwd.output.dim(2));
  std::printf("head 0 attention weights (row = query, column = key):\n");
  for (Index i = 0; i < 6; ++i) {
    for (Index j = 0; j < 6; ++j) std::printf(" %.3f", static_cast<double>(fwd.weights(0, 0, i, j)));
    std::printf("\n");
  }
  // The same weights as pictures (selfattn/plot/heatmap.hpp): all heads as an SVG grid, head 0 as CSV.
  const std::vector<std::string> tokens{"t0", "t1", "t2", "t3", "t4", "t5"};
  HeatmapOptions picture;
  picture.title = "causal self-attention, every head";
  picture.zero_is_masked = true;  // the causal mask's zeros are drawn hatched
  write_attention_heads_svg("quickstart_attention.svg", fwd.weights, 0, tokens, tokens, picture);
  write_attention_csv("quickstart_attention.csv", fwd.weights, 0, 0, tokens, tokens);
  std::printf("wrote quickstart_attention.svg (all heads) and quickstart_attention.csv (head 0)\n");

  // The kernel underneath: q, k, v as (B, H, L, D) tensors.
  Tensor<float, 4> q({1, 4, 6, 4}), k({1, 4, 6, 4}), v({1, 4, 6, 4});
  for (Index n = 0; n < q.size(); ++n) {
    q.data()[n] = std::sin(0.1f * static_cast<float>(n));
    k.data()[n] = std::cos(0.2f * static_cast<float>(n));
    v.data()[n] = std::sin(0.3f * static_cast<float>(n) + 1.0f);
  }
  auto att = sdpa_forward(q, k, v, opts);
  std::printf("sdpa_forward: out (%td, %td, %td, %td), lse (%td, %td, %td)\n", att.out.dim(0), att.out.dim(1),
              att.out.dim(2), att.out.dim(3), att.lse.dim(0), att.lse.dim(1), att.lse.dim(2));
  return 0;
}
