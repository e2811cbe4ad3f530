// A user's program: one include, one tensor. Exit code 0 iff the library behaves.
#include <selfattn/selfattn.hpp>

int main() {
  selfattn::Tensor<double, 2> t({2, 3});
  t(1, 2) = 4.0;
  return (t.size() == 6 && t(1, 2) == 4.0 && t.dim(1) == 3) ? 0 : 1;
}
