// opts.bias of AttentionOptions<float> holds float (and opts.allowed bool): a double bias is a mistake (convert it
// with tensor_cast, or compute in AttentionOptions<double>).
// expect: opts.allowed holds bool and opts.bias the element type T of AttentionOptions<T>
#include <selfattn/options.hpp>
#include <selfattn/tensor.hpp>

#include <array>

void compile_fail_case() {
  selfattn::AttentionOptions<float> opts;
#ifdef SELFATTN_COMPILE_FAIL_CONTROL
  const selfattn::Tensor<float, 2> bias(std::array<selfattn::Index, 2>{3, 5});
#else
  const selfattn::Tensor<double, 2> bias(std::array<selfattn::Index, 2>{3, 5});
#endif
  opts.bias = bias;
}
