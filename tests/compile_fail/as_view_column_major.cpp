// Eigen's default storage is column-major; viewing it as a row-major tensor would silently transpose it.
// expect: the Eigen matrix is column-major
#include <selfattn/tensor.hpp>

#include <Eigen/Core>

void compile_fail_case() {
#ifdef SELFATTN_COMPILE_FAIL_CONTROL
  selfattn::RowMajorMatrix<float> m(4, 8);
#else
  Eigen::MatrixXf m(4, 8);
#endif
  (void)selfattn::as_view(m);
}
