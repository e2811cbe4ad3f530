#include "mylib.hpp"

#include <selfattn/attention.hpp>

namespace mylib {

selfattn::Tensor<float, 4> causal_self_attention(const selfattn::Tensor<float, 4>& x) {
  selfattn::AttentionOptions<float> opts;
  opts.causal = selfattn::Causal::top_left;
  return selfattn::scaled_dot_product_attention(x, x, x, opts);
}

}  // namespace mylib
