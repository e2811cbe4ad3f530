// tests/support/sweep.hpp — the sweep every kernel test draws from: shapes with odd and prime lengths, Lq < Lk
// and Lq > Lk, head dims from 1 to 128, GQA and MQA; and every kind of mask, alone and all together, with the
// tensors the options point into.
#pragma once

#include <selfattn/options.hpp>
#include <selfattn/tensor.hpp>

#include "random.hpp"

#include <vector>

namespace selfattn::test {

struct Shape {
  Index batch, heads, kv_heads, q_len, k_len, head_dim, value_dim;
};

// L = 1, odd and prime lengths, Lq < Lk and Lq > Lk, D in {1, 8, 59, 64, 128}, Dv != D, GQA and MQA.
const std::vector<Shape> sweep_shapes = {
    {1, 1, 1, 1, 1, 1, 1},    {2, 2, 1, 1, 7, 8, 8},     {1, 4, 2, 13, 13, 59, 17}, {2, 3, 3, 17, 5, 64, 64},
    {1, 2, 2, 5, 17, 128, 33}, {2, 4, 1, 11, 29, 8, 3},   {3, 2, 2, 31, 31, 1, 2},   {1, 6, 3, 7, 3, 64, 16},
    {2, 1, 1, 23, 19, 59, 1},  {1, 2, 1, 37, 41, 128, 128},
};

enum class MaskKind {
  none, causal_top_left, causal_bottom_right, key_lengths, allowed_full, allowed_broadcast, bias_full,
  bias_broadcast, window, window_left_only, alibi, custom_scale, everything
};
const std::vector<MaskKind> mask_kinds = {
    MaskKind::none,           MaskKind::causal_top_left, MaskKind::causal_bottom_right, MaskKind::key_lengths,
    MaskKind::allowed_full,   MaskKind::allowed_broadcast, MaskKind::bias_full,         MaskKind::bias_broadcast,
    MaskKind::window,         MaskKind::window_left_only, MaskKind::alibi,              MaskKind::custom_scale,
    MaskKind::everything};

// Owns the mask tensors an AttentionOptions points into.
template <typename T>
struct MaskedOptions {
  Tensor<bool, 4> allowed;
  Tensor<T, 4> bias;
  AttentionOptions<T> opts;
};

template <typename T>
void make_options(MaskKind kind, const Shape& s, Random& random, MaskedOptions<T>& m) {
  const bool all = kind == MaskKind::everything;
  auto& o = m.opts;
  if (kind == MaskKind::causal_top_left) o.causal = Causal::top_left;
  if (kind == MaskKind::causal_bottom_right || all) o.causal = Causal::bottom_right;
  if (kind == MaskKind::key_lengths || all)
    for (Index b = 0; b < s.batch; ++b) o.key_lengths.push_back(b == 1 ? 0 : random.integer(1, s.k_len));
  if (kind == MaskKind::allowed_full) m.allowed = random.bool_tensor<4>({s.batch, s.heads, s.q_len, s.k_len}, 0.7);
  if (kind == MaskKind::allowed_broadcast || all) m.allowed = random.bool_tensor<4>({s.batch, 1, 1, s.k_len}, 0.8);
  if (kind == MaskKind::bias_full) m.bias = random.normal_tensor<T, 4>({s.batch, s.heads, s.q_len, s.k_len});
  if (kind == MaskKind::bias_broadcast || all) m.bias = random.normal_tensor<T, 4>({1, s.heads, s.q_len, 1});
  if (kind == MaskKind::window || all) {
    o.window_left = random.integer(0, 4);
    o.window_right = random.integer(0, 3);
  }
  if (kind == MaskKind::window_left_only) o.window_left = random.integer(0, 6);
  if (kind == MaskKind::alibi || all)
    for (Index h = 0; h < s.heads; ++h) o.alibi_slopes.push_back(static_cast<T>(random.uniform(0.05, 0.5)));
  if (kind == MaskKind::custom_scale || all) o.scale = static_cast<T>(random.uniform(0.05, 0.3));
  if (m.allowed.data()) o.allowed = m.allowed;
  if (m.bias.data()) o.bias = m.bias;
  o.need_weights = true;  // the reference sweep checks the weights too; fast paths reset it
}

}  // namespace selfattn::test
