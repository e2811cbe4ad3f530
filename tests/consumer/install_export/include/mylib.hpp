// The consumer library's public header: it shows selfattn types, hence links selfattn::selfattn PUBLIC.
#pragma once

#include <selfattn/tensor.hpp>

namespace mylib {

/// Causal self-attention of x (B, H, L, D) with itself as queries, keys and values.
selfattn::Tensor<float, 4> causal_self_attention(const selfattn::Tensor<float, 4>& x);

}  // namespace mylib
