// A float module takes 16-bit activations only all of one type: query, key, value and output alike.
// expect: all hold one 16-bit type
#include <selfattn/nn/multihead.hpp>

void compile_fail_case() {
  const selfattn::MultiHeadAttention<float> mha(selfattn::MultiHeadAttentionConfig{16, 2});
  selfattn::MhaWorkspace<float> workspace;
  selfattn::Tensor<selfattn::bfloat16, 3> query({1, 3, 16}), output({1, 3, 16});
#ifdef SELFATTN_COMPILE_FAIL_CONTROL
  selfattn::Tensor<selfattn::bfloat16, 3> memory({1, 5, 16});
#else
  selfattn::Tensor<float, 3> memory({1, 5, 16});
#endif
  mha.forward_into(query, memory, memory, output, workspace);
}
