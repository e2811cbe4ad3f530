// Attention computes in float or double (16-bit inputs in float); integer tensors are refused with a sentence.
// expect: attention runs on float, double, bfloat16 or float16 tensors
#include <selfattn/attention.hpp>

void compile_fail_case() {
#ifdef SELFATTN_COMPILE_FAIL_CONTROL
  selfattn::Tensor<double, 4> q({1, 2, 3, 8});
#else
  selfattn::Tensor<int, 4> q({1, 2, 3, 8});
#endif
  (void)selfattn::scaled_dot_product_attention(q, q, q);
}
