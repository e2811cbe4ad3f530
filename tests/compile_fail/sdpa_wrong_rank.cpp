// Attention takes (batch, heads, length, head_dim) tensors; a (batch, length, embed) one is a mistake.
// expect: must be rank 4: \(batch, heads, length, head_dim\)
#include <selfattn/attention.hpp>

void compile_fail_case() {
  selfattn::Tensor<float, 4> k({1, 2, 3, 8}), v({1, 2, 3, 8});
#ifdef SELFATTN_COMPILE_FAIL_CONTROL
  selfattn::Tensor<float, 4> q({1, 2, 3, 8});
#else
  selfattn::Tensor<float, 3> q({1, 3, 16});
#endif
  (void)selfattn::sdpa_forward(q, k, v);
}
