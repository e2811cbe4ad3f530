// Masks and biases line up with the scores (B, H, Lq, Lk) from the right, as PyTorch's scaled_dot_product_attention
// reads its attn_mask, and have rank 2, 3 or 4: a (Lk) key mask alone is a mistake (give it as (1, Lk) for every
// query, or (B, 1, 1, Lk) per batch entry).
// expect: an attention mask or bias has rank 2 \(Lq, Lk\), 3 \(H, Lq, Lk\) or 4 \(B, H, Lq, Lk\)
#include <selfattn/options.hpp>
#include <selfattn/tensor.hpp>

#include <array>

void compile_fail_case() {
  selfattn::AttentionOptions<float> opts;
#ifdef SELFATTN_COMPILE_FAIL_CONTROL
  const selfattn::Tensor<bool, 2> keys(std::array<selfattn::Index, 2>{1, 5});
#else
  const selfattn::Tensor<bool, 1> keys(std::array<selfattn::Index, 1>{5});
#endif
  opts.allowed = keys;
}
