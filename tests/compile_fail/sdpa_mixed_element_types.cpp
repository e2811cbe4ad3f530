// q, k and v hold one element type: float with double is a mistake, not a conversion.
// expect: must hold one element type: all float, double, bfloat16 or float16
#include <selfattn/attention.hpp>

void compile_fail_case() {
  selfattn::Tensor<float, 4> q({1, 2, 3, 8}), v({1, 2, 3, 8});
#ifdef SELFATTN_COMPILE_FAIL_CONTROL
  selfattn::Tensor<float, 4> k({1, 2, 3, 8});
#else
  selfattn::Tensor<double, 4> k({1, 2, 3, 8});
#endif
  (void)selfattn::sdpa_forward(q, k, v);
}
