// sdpa_backward's lse is (batch, heads, length): passing the output in its place is a mistake.
// expect: lse must be a rank-3 \(batch, heads, length\)
#include <selfattn/attention.hpp>

void compile_fail_case() {
  selfattn::Tensor<float, 4> q({1, 2, 3, 8});
  const auto fwd = selfattn::sdpa_forward(q, q, q);
#ifdef SELFATTN_COMPILE_FAIL_CONTROL
  (void)selfattn::sdpa_backward(q, q, q, fwd.out, fwd.lse, fwd.out);
#else
  (void)selfattn::sdpa_backward(q, q, q, fwd.out, fwd.out, fwd.out);
#endif
}
