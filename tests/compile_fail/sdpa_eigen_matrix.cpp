// An Eigen matrix is not a (B, H, L, D) tensor: the message says what to pass instead.
// expect: must be selfattn::Tensor or TensorView; an Eigen matrix is not one
#include <selfattn/attention.hpp>

#include <Eigen/Core>

void compile_fail_case() {
  selfattn::Tensor<float, 4> k({1, 1, 3, 8}), v({1, 1, 3, 8});
#ifdef SELFATTN_COMPILE_FAIL_CONTROL
  selfattn::RowMajorMatrix<float> m(3, 8);
  const selfattn::TensorView<const float, 4> q(m.data(), {1, 1, 3, 8});
#else
  Eigen::MatrixXf q(3, 8);
#endif
  (void)selfattn::sdpa_forward(q, k, v);
}
