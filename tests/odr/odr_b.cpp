// ODR check, translation unit B: the same templates instantiated again, other values.
#include <selfattn/selfattn.hpp>

#include <utility>

std::pair<selfattn::Index, float> odr_b() {
  selfattn::Tensor<float, 3> x({3, 1, 5});
  x(2, 0, 4) = -2.0f;
  return {x.size(), x(2, 0, 4)};
}
