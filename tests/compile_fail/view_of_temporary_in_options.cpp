// A view of a temporary tensor would dangle as soon as the statement ends: opts.bias = make_bias() must not
// compile (keep the tensor in a variable).
// expect: deleted
#include <selfattn/options.hpp>
#include <selfattn/tensor.hpp>

selfattn::Tensor<float, 4> make_bias() { return selfattn::Tensor<float, 4>({1, 1, 3, 3}); }

void compile_fail_case() {
  selfattn::AttentionOptions<float> opts;
#ifdef SELFATTN_COMPILE_FAIL_CONTROL
  const selfattn::Tensor<float, 4> bias = make_bias();
  opts.bias = bias;
#else
  opts.bias = make_bias();
#endif
}
