// The module takes (batch, length, embed_dim) inputs; split heads are for sdpa_forward.
// expect: must be rank 3: \(batch, length, features\)
#include <selfattn/nn/multihead.hpp>

void compile_fail_case() {
  const selfattn::MultiHeadAttention<float> mha(selfattn::MultiHeadAttentionConfig{16, 2});
#ifdef SELFATTN_COMPILE_FAIL_CONTROL
  selfattn::Tensor<float, 3> x({1, 3, 16});
#else
  selfattn::Tensor<float, 4> x({1, 2, 3, 8});
#endif
  (void)mha.forward(x);
}
