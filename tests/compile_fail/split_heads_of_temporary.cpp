// split_heads returns a view: of a temporary, it would dangle.
// expect: deleted
#include <selfattn/heads.hpp>

selfattn::Tensor<float, 3> load() { return selfattn::Tensor<float, 3>({1, 3, 16}); }

void compile_fail_case() {
#ifdef SELFATTN_COMPILE_FAIL_CONTROL
  const selfattn::Tensor<float, 3> x = load();
  (void)selfattn::split_heads(x, 2);
#else
  (void)selfattn::split_heads(load(), 2);
#endif
}
