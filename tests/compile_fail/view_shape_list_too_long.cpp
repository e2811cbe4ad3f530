// A view's braced shape (and strides) must list one extent per dimension.
// expect: one extent per dimension
#include <selfattn/tensor.hpp>

void compile_fail_case() {
  float buffer[24] = {};
#ifdef SELFATTN_COMPILE_FAIL_CONTROL
  selfattn::TensorView<float, 2> m(buffer, {4, 6});
#else
  selfattn::TensorView<float, 2> m(buffer, {2, 3, 4});
#endif
  (void)m;
}
