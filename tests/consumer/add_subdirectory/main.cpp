// A user's program, compiled with -Wall -Wextra -Wsign-conversion -Werror -march=native: it calls the main public
// paths (attention forward and backward, the module's forward, backward and step) so that their templates are
// instantiated here, in float only (with the module in double as well it was CI's slowest consumer: 102 CPU s of
// the release stage's ctest on 2026-12-07, on a machine busy with other builds).
// Exit code 0 iff the results are finite and the step equals the causal forward.
#include <selfattn/selfattn.hpp>

#include <algorithm>
#include <cmath>

using namespace selfattn;

int main() {
  Tensor<float, 4> q({1, 4, 20, 8}), k({1, 2, 20, 8}), v({1, 2, 20, 8});
  for (Index n = 0; n < q.size(); ++n) q.data()[n] = static_cast<float>(n % 5) * 0.1f;
  for (Index n = 0; n < k.size(); ++n) k.data()[n] = static_cast<float>(n % 3) * 0.2f;
  for (Index n = 0; n < v.size(); ++n) v.data()[n] = static_cast<float>(n % 7) * 0.3f;
  AttentionOptions<float> opts;
  opts.causal = Causal::top_left;
  AttentionForward<float> fwd = sdpa_forward(q, k, v, opts);
  Tensor<float, 4> dout(fwd.out.shape());
  for (Index n = 0; n < dout.size(); ++n) dout.data()[n] = 1.0f;
  AttentionGradients<float> g = sdpa_backward(q, k, v, fwd.out, fwd.lse, dout, opts);

  MultiHeadAttentionConfig cfg;
  cfg.embed_dim = 16;
  cfg.num_heads = 4;
  cfg.num_kv_heads = 2;
  cfg.rope_dim = 4;
  MultiHeadAttention<float> mha(cfg);
  Tensor<float, 3> x({2, 6, 16});
  for (Index n = 0; n < x.size(); ++n) x.data()[n] = std::sin(static_cast<float>(n));
  AttentionOptions<float> mopts;
  mopts.causal = Causal::top_left;
  MhaForward<float> mf = mha.forward(x, mopts);
  MhaGradients<float> mg = mha.backward(mf.output, mf);
  auto cache = mha.make_cache(2);
  Tensor<float, 3> y = mha.step(x, cache);
  float diff = 0;
  for (Index n = 0; n < y.size(); ++n) diff = std::max(diff, std::abs(y.data()[n] - mf.output.data()[n]));
  const bool ok =
      std::isfinite(static_cast<double>(g.dq(0, 0, 3, 1))) && std::isfinite(mg.d_query(0, 0, 0)) && diff < 1e-5f;
  return ok ? 0 : 1;
}
