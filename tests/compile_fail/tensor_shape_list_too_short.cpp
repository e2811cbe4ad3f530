// A braced shape must list one extent per dimension: std::array would pad {2, 4, 5} to (2, 4, 5, 0).
// expect: one extent per dimension
#include <selfattn/tensor.hpp>

void compile_fail_case() {
#ifdef SELFATTN_COMPILE_FAIL_CONTROL
  selfattn::Tensor<float, 4> q({2, 4, 5, 8});
#else
  selfattn::Tensor<float, 4> q({2, 4, 5});
#endif
  (void)q;
}
