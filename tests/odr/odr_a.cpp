// ODR check, translation unit A: includes the umbrella header, as odr_b.cpp does.
// If a header defines a non-inline function or variable, linking odr_test fails.
#include <selfattn/selfattn.hpp>

#include <utility>

std::pair<selfattn::Index, float> odr_a() {
  selfattn::Tensor<float, 3> x({2, 3, 4});
  x(1, 2, 3) = 1.5f;
  return {x.size(), x(1, 2, 3)};
}
