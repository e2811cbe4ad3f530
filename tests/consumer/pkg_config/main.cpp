// Compiled by run_consumer.cmake with nothing but `pkg-config --cflags selfattn` (and -std=c++17): the installed
// selfattn.pc must give the include directories of selfattn and of Eigen. Exit code 0 iff attention runs.
#include <selfattn/selfattn.hpp>

#include <cstdio>

int main() {
  using namespace selfattn;
  Tensor<float, 4> q({1, 2, 5, 4}), k({1, 2, 5, 4}), v({1, 2, 5, 4});
  for (Index n = 0; n < v.size(); ++n) v.data()[n] = 1.0f;
  AttentionOptions<float> opts;
  opts.causal = Causal::top_left;
  const Tensor<float, 4> out = scaled_dot_product_attention(q, k, v, opts);  // every weight row sums to 1
  const bool ok = out(0, 1, 4, 3) > 0.999f && out(0, 1, 4, 3) < 1.001f;
  std::printf("selfattn %s through pkg-config: %s\n", SELFATTN_VERSION_STRING, ok ? "ok" : "WRONG");
  return ok ? 0 : 1;
}
