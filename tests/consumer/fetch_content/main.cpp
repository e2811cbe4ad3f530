// A user's program: one include, one call. Exit code 0 iff the library behaves. merge_heads rather than an attention
// call: what this checks is FetchContent, and an attention call compiles every kernel level into this program.
#include <selfattn/selfattn.hpp>

#include <cstdio>

int main() {
  using namespace selfattn;
  Tensor<float, 4> heads({1, 2, 3, 4});  // (B, H, L, D)
  for (Index n = 0; n < heads.size(); ++n) heads.data()[n] = static_cast<float>(n);
  const Tensor<float, 3> merged = merge_heads(heads);  // (1, 3, 8): row l is head 0's row l, then head 1's
  const bool ok = merged(0, 2, 5) == heads(0, 1, 2, 1);
  std::printf("selfattn %s through FetchContent: %s\n", SELFATTN_VERSION_STRING, ok ? "ok" : "WRONG");
  return ok ? 0 : 1;
}
