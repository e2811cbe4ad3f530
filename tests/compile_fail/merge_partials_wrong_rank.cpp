// merge_attention_partials takes outputs (B, H, Lq, Dv) and log-sum-exps (B, H, Lq), in that order.
// expect: lse_a, lse_b rank-3
#include <selfattn/merge.hpp>

void compile_fail_case() {
  selfattn::Tensor<double, 4> out({1, 2, 3, 8});
  selfattn::Tensor<double, 3> lse({1, 2, 3});
#ifdef SELFATTN_COMPILE_FAIL_CONTROL
  (void)selfattn::merge_attention_partials(out, lse, out, lse);
#else
  (void)selfattn::merge_attention_partials(out, out, lse, lse);
#endif
}
