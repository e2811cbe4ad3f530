// tests/support/brute_force.hpp — attention written straight from the semantics in API.md, with plain
// loops in long double and none of the library's mask or kernel code. The library's reference kernel
// is tested against this; it is too slow for anything else.
#pragma once

#include <selfattn/options.hpp>
#include <selfattn/tensor.hpp>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <vector>

namespace selfattn::test {

template <typename T>
struct BruteForceResult {
  Tensor<T, 4> out;      // (B, H, Lq, Dv)
  Tensor<T, 3> lse;      // (B, H, Lq)
  Tensor<T, 4> weights;  // (B, H, Lq, Lk)
};

/// Reads a rank-4 tensor with NumPy broadcasting (extent-1 dims repeat).
template <typename T>
T broadcast_at(const TensorView<const T, 4>& x, Index b, Index h, Index i, Index j) {
  return x(x.dim(0) == 1 ? 0 : b, x.dim(1) == 1 ? 0 : h, x.dim(2) == 1 ? 0 : i, x.dim(3) == 1 ? 0 : j);
}

/// May query i of (b, h) see key j? Every mask of AttentionOptions, one condition each.
template <typename T>
bool brute_force_allowed(const AttentionOptions<T>& opts, Index b, Index h, Index i, Index j, Index q_len, Index k_len) {
  const Index off = k_len - q_len, c = i + off;
  if (opts.causal == Causal::top_left && j > i) return false;
  if (opts.causal == Causal::bottom_right && j > c) return false;
  if (!opts.key_lengths.empty() && j >= opts.key_lengths[static_cast<std::size_t>(b)]) return false;
  if (opts.window_left >= 0 && j < c - opts.window_left) return false;
  if (opts.window_right >= 0 && j > c + opts.window_right) return false;
  if (opts.allowed.data() && !broadcast_at(opts.allowed, b, h, i, j)) return false;
  return true;
}

template <typename T>
BruteForceResult<T> brute_force_attention(const TensorView<const T, 4>& q, const TensorView<const T, 4>& k,
                                          const TensorView<const T, 4>& v, const AttentionOptions<T>& opts) {
  using Real = long double;
  const Index B = q.dim(0), H = q.dim(1), Lq = q.dim(2), D = q.dim(3), Hkv = k.dim(1), Lk = k.dim(2), Dv = v.dim(3);
  const Real scale = opts.scale ? static_cast<Real>(*opts.scale) : 1.0L / std::sqrt(static_cast<Real>(D));
  BruteForceResult<T> r{Tensor<T, 4>({B, H, Lq, Dv}), Tensor<T, 3>({B, H, Lq}), Tensor<T, 4>({B, H, Lq, Lk})};
  for (Index b = 0; b < B; ++b)
    for (Index h = 0; h < H; ++h) {
      const Index hk = h / (H / Hkv);
      for (Index i = 0; i < Lq; ++i) {
        std::vector<Real> s(static_cast<std::size_t>(Lk));
        std::vector<bool> on(static_cast<std::size_t>(Lk));
        Real max = -std::numeric_limits<Real>::infinity();
        for (Index j = 0; j < Lk; ++j) {
          Real dot = 0;
          for (Index d = 0; d < D; ++d) dot += static_cast<Real>(q(b, h, i, d)) * static_cast<Real>(k(b, hk, j, d));
          Real score = scale * dot;
          if (opts.bias.data()) score += static_cast<Real>(broadcast_at(opts.bias, b, h, i, j));
          if (!opts.alibi_slopes.empty())
            score -= static_cast<Real>(opts.alibi_slopes[static_cast<std::size_t>(h)]) *
                     static_cast<Real>(std::abs(i + (Lk - Lq) - j));
          const bool visible = brute_force_allowed(opts, b, h, i, j, Lq, Lk) && score != -std::numeric_limits<Real>::infinity();
          on[static_cast<std::size_t>(j)] = visible;
          s[static_cast<std::size_t>(j)] = score;
          if (visible && score > max) max = score;
        }
        Real sum = 0;
        for (Index j = 0; j < Lk; ++j)
          if (on[static_cast<std::size_t>(j)]) sum += std::exp(s[static_cast<std::size_t>(j)] - max);
        // No allowed key: sum 0, lse -inf. A NaN score at an allowed key makes the sum, hence lse, NaN.
        r.lse(b, h, i) = sum == 0 ? -std::numeric_limits<T>::infinity() : static_cast<T>(max + std::log(sum));
        for (Index j = 0; j < Lk; ++j) {
          const Real p = on[static_cast<std::size_t>(j)] ? std::exp(s[static_cast<std::size_t>(j)] - max) / sum : 0;
          r.weights(b, h, i, j) = static_cast<T>(p);
        }
        for (Index d = 0; d < Dv; ++d) {
          Real o = 0;
          for (Index j = 0; j < Lk; ++j)
            if (on[static_cast<std::size_t>(j)])
              o += std::exp(s[static_cast<std::size_t>(j)] - max) / sum * static_cast<Real>(v(b, hk, j, d));
          r.out(b, h, i, d) = static_cast<T>(o);
        }
      }
    }
  return r;
}

/// Keys or values (B, Hkv, L, D) repeated per query head: (B, H, L, D), head h a copy of kv head h / (H / Hkv).
template <typename T>
Tensor<T, 4> repeat_kv_heads(const Tensor<T, 4>& x, Index heads) {
  Tensor<T, 4> y({x.dim(0), heads, x.dim(2), x.dim(3)});
  for (Index b = 0; b < x.dim(0); ++b)
    for (Index h = 0; h < heads; ++h)
      for (Index l = 0; l < x.dim(2); ++l)
        for (Index d = 0; d < x.dim(3); ++d) y(b, h, l, d) = x(b, h / (heads / x.dim(1)), l, d);
  return y;
}

/// The adjoint of repeat_kv_heads: (B, H, L, D) summed over each group of H / Hkv heads -> (B, Hkv, L, D).
template <typename T>
Tensor<T, 4> sum_kv_groups(const Tensor<T, 4>& x, Index kv_heads) {
  Tensor<T, 4> y({x.dim(0), kv_heads, x.dim(2), x.dim(3)});
  for (Index b = 0; b < x.dim(0); ++b)
    for (Index h = 0; h < x.dim(1); ++h)
      for (Index l = 0; l < x.dim(2); ++l)
        for (Index d = 0; d < x.dim(3); ++d) y(b, h / (x.dim(1) / kv_heads), l, d) += x(b, h, l, d);
  return y;
}

}  // namespace selfattn::test
