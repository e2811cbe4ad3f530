// The calling translation unit of the extern-templates test (tests/extern_templates/CMakeLists.txt): it includes
// <selfattn/extern_templates.hpp>, so it must compile none of the kernels; instances.cpp defines them. Exit code
// 0 iff every call gives what it should: the fused and decode kernels against the reference kernel (all through
// the extern instances), the _into form, the backward of both kernels, and the module in float and double
// (forward, backward, and step against forward).
//
// -DSELFATTN_TEST_NO_EXTERN leaves the header out: the same calls then compile the kernels here (the "without"
// of the compile-time measurement in docs/using_in_projects.md). The instances come from that page's snippet
// (instances.cpp in the build directory, see CMakeLists.txt).
#include <selfattn/selfattn.hpp>
#ifndef SELFATTN_TEST_NO_EXTERN
#include <selfattn/extern_templates.hpp>
#endif

#include <algorithm>
#include <cmath>
#include <cstdio>

using namespace selfattn;

namespace {

int failures = 0;

void expect_close(const char* what, double difference, double tolerance) {
  const bool ok = difference <= tolerance;  // false for NaN
  std::printf("%-52s max |difference| %.3g (tolerance %.1g): %s\n", what, difference, tolerance, ok ? "ok" : "FAILED");
  if (!ok) ++failures;
}

template <typename T, int Rank>
double max_difference(const Tensor<T, Rank>& a, const Tensor<T, Rank>& b) {
  if (a.shape() != b.shape()) return INFINITY;
  double m = 0;
  for (Index n = 0; n < a.size(); ++n)
    m = std::max(m, std::abs(static_cast<double>(a.data()[n]) - static_cast<double>(b.data()[n])));
  return m;
}

template <typename T, int Rank>
void fill(Tensor<T, Rank>& t, int seed) {
  for (Index n = 0; n < t.size(); ++n) t.data()[n] = static_cast<T>(std::sin(0.37 * static_cast<double>(n + seed)));
}

void attention_calls() {
  Tensor<float, 4> q({2, 4, 37, 16}), k({2, 2, 37, 16}), v({2, 2, 37, 16}), dout({2, 4, 37, 16});
  fill(q, 1);
  fill(k, 2);
  fill(v, 3);
  fill(dout, 4);
  AttentionOptions<float> opts;
  opts.causal = Causal::top_left;
  opts.kernel = Kernel::fused;
  const AttentionForward<float> fused = sdpa_forward(q, k, v, opts);
  opts.kernel = Kernel::decode;
  const AttentionForward<float> decode = sdpa_forward(q, k, v, opts);
  opts.kernel = Kernel::reference;
  const AttentionForward<float> reference = sdpa_forward(q, k, v, opts);
  expect_close("sdpa_forward fused vs reference", max_difference(fused.out, reference.out), 1e-5);
  expect_close("sdpa_forward decode vs reference", max_difference(decode.out, reference.out), 1e-5);

  opts.kernel = Kernel::fused;
  Tensor<float, 4> out({2, 4, 37, 16});
  Tensor<float, 3> lse({2, 4, 37});
  sdpa_forward_into(q, k, v, out.view(), lse.view(), opts);
  expect_close("sdpa_forward_into vs sdpa_forward", max_difference(out, fused.out), 0.0);

  const AttentionGradients<float> g_fused = sdpa_backward(q, k, v, fused.out, fused.lse, dout, opts);
  opts.kernel = Kernel::reference;
  const AttentionGradients<float> g_reference = sdpa_backward(q, k, v, fused.out, fused.lse, dout, opts);
  expect_close("sdpa_backward dq fused vs reference", max_difference(g_fused.dq, g_reference.dq), 1e-4);
  expect_close("sdpa_backward dk fused vs reference", max_difference(g_fused.dk, g_reference.dk), 1e-4);
  expect_close("sdpa_backward dv fused vs reference", max_difference(g_fused.dv, g_reference.dv), 1e-4);

  const Tensor<float, 4> weights = attention_weights(q, k, opts);
  double row_sum_error = 0;
  for (Index b = 0; b < 2; ++b)
    for (Index h = 0; h < 4; ++h)
      for (Index i = 0; i < 37; ++i) {
        double sum = 0;
        for (Index j = 0; j < 37; ++j) sum += static_cast<double>(weights(b, h, i, j));
        row_sum_error = std::max(row_sum_error, std::abs(sum - 1.0));
      }
  expect_close("attention_weights rows sum to 1", row_sum_error, 1e-5);
}

template <typename T>
void module_calls(const char* forward_name, const char* step_name, double tolerance) {
  MultiHeadAttentionConfig cfg;
  cfg.embed_dim = 32;
  cfg.num_heads = 4;
  cfg.num_kv_heads = 2;
  cfg.rope_dim = 8;
  const MultiHeadAttention<T> mha(cfg, 7);
  Tensor<T, 3> x({2, 21, 32});
  fill(x, 5);
  AttentionOptions<T> opts;
  opts.causal = Causal::top_left;
  const MhaForward<T> fwd = mha.forward(x, opts);
  const MhaGradients<T> g = mha.backward(fwd.output, fwd);  // the gradient of sum(output^2) / 2
  expect_close(forward_name, std::isfinite(static_cast<double>(g.params.q_weight(3, 5))) ? 0.0 : INFINITY, 0.0);

  KVCache<T> cache = mha.make_cache(2);
  Tensor<T, 3> first({2, 13, 32}), rest({2, 8, 32});
  std::copy_n(x.data(), 13 * 32, first.data());
  std::copy_n(x.data() + 21 * 32, 13 * 32, first.data() + 13 * 32);
  std::copy_n(x.data() + 13 * 32, 8 * 32, rest.data());
  std::copy_n(x.data() + 21 * 32 + 13 * 32, 8 * 32, rest.data() + 8 * 32);
  const Tensor<T, 3> y_first = mha.step(first, cache);  // a prefill, then the rest: equals the causal forward
  const Tensor<T, 3> y_rest = mha.step(rest, cache);
  double m = 0;
  for (Index b = 0; b < 2; ++b)
    for (Index l = 0; l < 21; ++l)
      for (Index e = 0; e < 32; ++e) {
        const T stepped = l < 13 ? y_first(b, l, e) : y_rest(b, l - 13, e);
        m = std::max(m, std::abs(static_cast<double>(stepped - fwd.output(b, l, e))));
      }
  expect_close(step_name, m, tolerance);
}

}  // namespace

int main() {
  attention_calls();
  module_calls<float>("MultiHeadAttention<float> backward finite", "MultiHeadAttention<float> step vs forward", 1e-5);
  module_calls<double>("MultiHeadAttention<double> backward finite", "MultiHeadAttention<double> step vs forward",
                       1e-12);
  std::printf("%s\n", failures == 0 ? "all ok" : "FAILED");
  return failures == 0 ? 0 : 1;
}
