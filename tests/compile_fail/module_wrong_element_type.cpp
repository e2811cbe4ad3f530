// A MultiHeadAttention<float> takes float inputs.
// expect: must hold the module's element type T
#include <selfattn/nn/multihead.hpp>

void compile_fail_case() {
  const selfattn::MultiHeadAttention<float> mha(selfattn::MultiHeadAttentionConfig{16, 2});
  auto cache = mha.make_cache(1);
#ifdef SELFATTN_COMPILE_FAIL_CONTROL
  selfattn::Tensor<float, 3> x({1, 3, 16});
#else
  selfattn::Tensor<double, 3> x({1, 3, 16});
#endif
  (void)mha.step(x, cache);
}
