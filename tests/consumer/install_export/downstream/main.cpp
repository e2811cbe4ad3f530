// Exit code 0 iff mylib's attention, found through the installed mylib and selfattn packages, behaves.
#include <mylib.hpp>

#include <cstdio>

int main() {
  selfattn::Tensor<float, 4> x({1, 1, 3, 2});
  for (selfattn::Index l = 0; l < 3; ++l)
    for (selfattn::Index d = 0; d < 2; ++d) x(0, 0, l, d) = 0.5f * static_cast<float>(l) + static_cast<float>(d);
  const selfattn::Tensor<float, 4> y = mylib::causal_self_attention(x);
  // Causal: query 0 sees key 0 only, with weight 1, so its output is value row 0 exactly.
  const bool ok = y.dim(2) == 3 && y(0, 0, 0, 0) == x(0, 0, 0, 0) && y(0, 0, 0, 1) == x(0, 0, 0, 1);
  std::printf("mylib from its installed package: %s\n", ok ? "ok" : "WRONG");
  return ok ? 0 : 1;
}
