// A user's program: one include, one attention call. Exit code 0 iff the library behaves.
#include <selfattn/selfattn.hpp>

#include <cstdio>

int main() {
  using namespace selfattn;
  Tensor<float, 4> q({1, 2, 6, 4}), k({1, 1, 6, 4}), v({1, 1, 6, 4});  // GQA: two query heads share one
  for (Index n = 0; n < v.size(); ++n) v.data()[n] = static_cast<float>(n / 4);  // value row j holds j
  AttentionOptions<float> opts;
  opts.causal = Causal::top_left;
  const AttentionForward<float> fwd = sdpa_forward(q, k, v, opts);  // q = k = 0: uniform weights over 0..i
  const bool ok = fwd.out(0, 1, 5, 0) > 2.499f && fwd.out(0, 1, 5, 0) < 2.501f;  // mean of 0..5
  std::printf("selfattn %s through FetchContent: %s\n", SELFATTN_VERSION_STRING, ok ? "ok" : "WRONG");
  return ok ? 0 : 1;
}
