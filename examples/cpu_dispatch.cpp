// cpu_dispatch.cpp — what this CPU runs: the level selfattn's kernels were chosen at (docs/dispatch.md), and a
// fused attention call at that level timed against the reference kernel and checked against it.
//
// Built like every example, without -march: the program targets the oldest x86-64 (SSE2), and the fused kernel still
// runs with the widest vectors this CPU has. Run it again with SELFATTN_ISA=generic (or avx2) to see a lower level.
// Exits 1 when the fused result differs from the reference by more than float rounding allows.
#include <selfattn/selfattn.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>

using namespace selfattn;

namespace {

/// The best of three calls of f, in milliseconds.
template <typename F>
double best_of_three(F&& f) {
  double best = 1e300;
  for (int run = 0; run < 3; ++run) {
    const auto start = std::chrono::steady_clock::now();
    f();
    best = std::min(best, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  }
  return best;
}

}  // namespace

int main() {
  const CpuInfo& cpu = cpu_info();
  std::printf("%s\n", to_string(cpu).c_str());

  // Causal self-attention of 8 heads over 1024 tokens, head dim 64.
  const Index heads = 8, length = 1024, dim = 64;
  std::mt19937 generator(7);
  std::normal_distribution<float> normal;
  Tensor<float, 4> q({1, heads, length, dim}), k({1, heads, length, dim}), v({1, heads, length, dim});
  for (Tensor<float, 4>* t : {&q, &k, &v})
    for (Index n = 0; n < t->size(); ++n) t->data()[n] = normal(generator);

  AttentionOptions<float> fused;
  fused.causal = Causal::top_left;
  fused.kernel = Kernel::fused;
  AttentionOptions<float> reference = fused;
  reference.kernel = Kernel::reference;

  Tensor<float, 4> out_fused, out_reference;
  const double fused_ms = best_of_three([&] { out_fused = scaled_dot_product_attention(q, k, v, fused); });
  const double reference_ms = best_of_three([&] { out_reference = scaled_dot_product_attention(q, k, v, reference); });
  float difference = 0;
  for (Index n = 0; n < out_fused.size(); ++n)
    difference = std::max(difference, std::abs(out_fused.data()[n] - out_reference.data()[n]));

  // Useful work of a causal call: QK^T and PV over half the (query, key) pairs, 2 flops per multiply-add.
  const double flops = 4.0 * static_cast<double>(heads * length) * static_cast<double>(length) * dim / 2;
  std::printf("fused kernel at level %s: %.2f ms (%.1f GFLOP/s)\n", to_string(cpu.selected), fused_ms,
              flops / fused_ms / 1e6);
  std::printf("reference kernel (Eigen, as compiled): %.2f ms\n", reference_ms);
  std::printf("largest difference between them: %.3g (allowed 1e-5)\n", static_cast<double>(difference));
  if (!(difference <= 1e-5f)) {
    std::printf("FAILED: the fused kernel at level %s does not match the reference\n", to_string(cpu.selected));
    return 1;
  }
  return 0;
}
