// tests/support/module_by_hand.hpp — MultiHeadAttention computed without any of its parts: projections by loops in
// long double, heads by index arithmetic, RoPE from its definition, ALiBi slopes as numbers, and the brute-force
// attention of brute_force.hpp. The module tests and the KV cache tests take expectations from it.
#pragma once

#include <selfattn/nn/multihead.hpp>

#include "brute_force.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace selfattn::test {

// RoPE written from its definition, independent of positional.hpp: the pair (a, b) of dims (i, i + R/2) (half) or
// (2i, 2i + 1) (interleaved) of row l turns by the angle (offset + l) * base^(-2i / R), in long double.
template <typename T>
void rotate_by_hand(Tensor<T, 4>& x, Index rope_dim, double base, RopeStyle style, Index offset) {
  for (Index b = 0; b < x.dim(0); ++b)
    for (Index h = 0; h < x.dim(1); ++h)
      for (Index l = 0; l < x.dim(2); ++l)
        for (Index i = 0; i < rope_dim / 2; ++i) {
          const Index first = style == RopeStyle::half ? i : 2 * i;
          const Index second = style == RopeStyle::half ? i + rope_dim / 2 : 2 * i + 1;
          const long double angle = static_cast<long double>(offset + l) *
                                    std::pow(static_cast<long double>(base), -2.0L * i / rope_dim);
          const long double a = x(b, h, l, first), c = x(b, h, l, second);
          x(b, h, l, first) = static_cast<T>(a * std::cos(angle) - c * std::sin(angle));
          x(b, h, l, second) = static_cast<T>(a * std::sin(angle) + c * std::cos(angle));
        }
}

// ALiBi's slopes as numbers, not from positional.hpp: 2^(-8 (h + 1) / H) for H = 4; for H = 3 and 6 the paper's
// rule, the slopes of the largest power of two n < H (2: 2^-4, 2^-8; 4: as above) then those of 2n at indices 0,
// 2, ... (H = 4 at 0: 2^-2; H = 8 at 0 and 2: 2^-1, 2^-3).
template <typename T>
std::vector<T> fixed_alibi_slopes(Index heads) {
  if (heads == 3) return {T(0.0625), T(0.00390625), T(0.25)};
  if (heads == 4) return {T(0.25), T(0.0625), T(0.015625), T(0.00390625)};
  if (heads == 6) return {T(0.25), T(0.0625), T(0.015625), T(0.00390625), T(0.5), T(0.125)};
  ADD_FAILURE() << "no fixed ALiBi slopes for " << heads << " heads";
  return {};
}

// Projections by loops, heads by index arithmetic, RoPE at bottom-right positions (rotate_by_hand), fixed ALiBi
// slopes, brute-force attention: none of the module's own parts.
template <typename T>
Tensor<T, 3> module_by_hand(const MultiHeadAttention<T>& mha, const Tensor<T, 3>& query, const Tensor<T, 3>& key,
                            const Tensor<T, 3>& value, AttentionOptions<T> opts) {
  const auto& cfg = mha.config();
  const auto& p = mha.params();
  const Index B = query.dim(0), Lq = query.dim(1), Lk = key.dim(1), H = cfg.num_heads, Hkv = cfg.num_kv_heads,
              Dh = mha.head_dim();
  const auto project = [](const Tensor<T, 3>& x, const Tensor<T, 2>& w, const Tensor<T, 1>& bias, Index heads) {
    const Index Dh = w.dim(0) / heads;
    Tensor<T, 4> y({x.dim(0), heads, x.dim(1), Dh});
    for (Index b = 0; b < x.dim(0); ++b)
      for (Index l = 0; l < x.dim(1); ++l)
        for (Index o = 0; o < w.dim(0); ++o) {
          long double sum = bias.size() ? bias(o) : T(0);
          for (Index i = 0; i < x.dim(2); ++i) sum += static_cast<long double>(x(b, l, i)) * w(o, i);
          y(b, o / Dh, l, o % Dh) = static_cast<T>(sum);
        }
    return y;
  };
  auto q = project(query, p.q_weight, p.q_bias, H), k = project(key, p.k_weight, p.k_bias, Hkv),
       v = project(value, p.v_weight, p.v_bias, Hkv);
  if (cfg.rope_dim > 0) {
    rotate_by_hand(q, cfg.rope_dim, cfg.rope_base, cfg.rope_style, Lk - Lq);
    rotate_by_hand(k, cfg.rope_dim, cfg.rope_base, cfg.rope_style, 0);
  }
  if (cfg.alibi) opts.alibi_slopes = fixed_alibi_slopes<T>(H);
  const auto heads = test::brute_force_attention<T>(q, k, v, opts).out;
  Tensor<T, 3> out({B, Lq, cfg.embed_dim});
  for (Index b = 0; b < B; ++b)
    for (Index l = 0; l < Lq; ++l)
      for (Index o = 0; o < cfg.embed_dim; ++o) {
        long double sum = p.out_bias.size() ? p.out_bias(o) : T(0);
        for (Index i = 0; i < cfg.embed_dim; ++i) sum += static_cast<long double>(heads(b, i / Dh, l, i % Dh)) * p.out_weight(o, i);
        out(b, l, o) = static_cast<T>(sum);
      }
  return out;
}

}  // namespace selfattn::test
