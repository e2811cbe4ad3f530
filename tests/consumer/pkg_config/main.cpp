// Compiled by run_consumer.cmake with nothing but `pkg-config --cflags selfattn` (and -std=c++17): the installed
// selfattn.pc must give the include directories of selfattn and of Eigen. Exit code 0 iff the library runs.
// merge_heads (Eigen maps underneath) rather than an attention call: packaging is what this checks, and an
// attention call compiles every kernel level into this program (28 CPU s of a 30-minute CI, for nothing more).
#include <selfattn/selfattn.hpp>

#include <cstdio>

int main() {
  using namespace selfattn;
  Tensor<float, 4> heads({1, 2, 3, 4});  // (B, H, L, D)
  for (Index n = 0; n < heads.size(); ++n) heads.data()[n] = static_cast<float>(n);
  const Tensor<float, 3> merged = merge_heads(heads);  // (1, 3, 8): row l is head 0's row l, then head 1's
  const bool ok = merged(0, 2, 5) == heads(0, 1, 2, 1);
  std::printf("selfattn %s through pkg-config: %s\n", SELFATTN_VERSION_STRING, ok ? "ok" : "WRONG");
  return ok ? 0 : 1;
}
