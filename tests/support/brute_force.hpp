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

/// Row i of query head h, batch b, in long double: every key's score s_ij, whether the masks let the row see it,
/// and the row's maximum and sum of exp(s_ij - max) over the visible keys and the sink, when there is one (a NaN
/// score at a visible key makes the sum NaN; no visible key and no sink leaves max = -inf and sum = 0).
/// With soft-capping s_ij = c tanh(x_ij / c) + ..., x_ij = scale q_i . k_j, and cap_slope_j = 1 - tanh^2(x_ij / c).
struct BruteForceRow {
  using Real = long double;
  std::vector<Real> s;
  std::vector<Real> cap_slope;
  std::vector<bool> on;
  Real max = -std::numeric_limits<Real>::infinity();
  Real sum = 0;
  Real sink = -std::numeric_limits<Real>::infinity();

  /// The sink's probability exp(sink - max) / sum, 0 without a sink.
  Real sink_probability() const {
    return sink == -std::numeric_limits<Real>::infinity() ? Real(0) : std::exp(sink - max) / sum;
  }

  /// P_ij: exp(s_ij - max) / sum where visible, else 0.
  Real probability(Index j) const {
    const auto at = static_cast<std::size_t>(j);
    return on[at] ? std::exp(s[at] - max) / sum : Real(0);
  }
};

template <typename T>
BruteForceRow brute_force_row(const TensorView<const T, 4>& q, const TensorView<const T, 4>& k,
                              const AttentionOptions<T>& opts, Index b, Index h, Index i) {
  using Real = BruteForceRow::Real;
  const Index H = q.dim(1), Lq = q.dim(2), D = q.dim(3), Hkv = k.dim(1), Lk = k.dim(2), hk = h / (H / Hkv);
  const Real scale = opts.scale ? static_cast<Real>(*opts.scale) : 1.0L / std::sqrt(static_cast<Real>(D));
  BruteForceRow row;
  row.s.resize(static_cast<std::size_t>(Lk));
  row.cap_slope.assign(static_cast<std::size_t>(Lk), Real(1));
  row.on.resize(static_cast<std::size_t>(Lk));
  for (Index j = 0; j < Lk; ++j) {
    Real dot = 0;
    for (Index d = 0; d < D; ++d) dot += static_cast<Real>(q(b, h, i, d)) * static_cast<Real>(k(b, hk, j, d));
    Real score = scale * dot;
    if (opts.softcap != T(0)) {
      const Real c = static_cast<Real>(opts.softcap), t = std::tanh(score / c);
      score = c * t;
      row.cap_slope[static_cast<std::size_t>(j)] = 1 - t * t;
    }
    if (opts.bias.data()) score += static_cast<Real>(broadcast_at(opts.bias, b, h, i, j));
    if (!opts.alibi_slopes.empty())
      score -= static_cast<Real>(opts.alibi_slopes[static_cast<std::size_t>(h)]) * static_cast<Real>(std::abs(i + (Lk - Lq) - j));
    const bool visible = brute_force_allowed(opts, b, h, i, j, Lq, Lk) && score != -std::numeric_limits<Real>::infinity();
    row.on[static_cast<std::size_t>(j)] = visible;
    row.s[static_cast<std::size_t>(j)] = score;
    if (visible && score > row.max) row.max = score;
  }
  if (!opts.sinks.empty()) {
    row.sink = static_cast<Real>(opts.sinks[static_cast<std::size_t>(h)]);
    if (row.sink > row.max) row.max = row.sink;
    if (row.sink != -std::numeric_limits<Real>::infinity()) row.sum += std::exp(row.sink - row.max);
  }
  for (Index j = 0; j < Lk; ++j)
    if (row.on[static_cast<std::size_t>(j)]) row.sum += std::exp(row.s[static_cast<std::size_t>(j)] - row.max);
  return row;
}

template <typename T>
BruteForceResult<T> brute_force_attention(const TensorView<const T, 4>& q, const TensorView<const T, 4>& k,
                                          const TensorView<const T, 4>& v, const AttentionOptions<T>& opts) {
  using Real = BruteForceRow::Real;
  const Index B = q.dim(0), H = q.dim(1), Lq = q.dim(2), Hkv = k.dim(1), Lk = k.dim(2), Dv = v.dim(3);
  BruteForceResult<T> r{Tensor<T, 4>({B, H, Lq, Dv}), Tensor<T, 3>({B, H, Lq}), Tensor<T, 4>({B, H, Lq, Lk})};
  for (Index b = 0; b < B; ++b)
    for (Index h = 0; h < H; ++h) {
      const Index hk = h / (H / Hkv);
      for (Index i = 0; i < Lq; ++i) {
        const BruteForceRow row = brute_force_row(q, k, opts, b, h, i);
        // No allowed key and no sink: sum 0, lse -inf. A NaN score at an allowed key makes the sum, hence lse, NaN.
        r.lse(b, h, i) = row.sum == 0 ? -std::numeric_limits<T>::infinity() : static_cast<T>(row.max + std::log(row.sum));
        for (Index j = 0; j < Lk; ++j) r.weights(b, h, i, j) = static_cast<T>(row.probability(j));
        for (Index d = 0; d < Dv; ++d) {
          Real o = 0;
          for (Index j = 0; j < Lk; ++j)
            if (row.on[static_cast<std::size_t>(j)]) o += row.probability(j) * static_cast<Real>(v(b, hk, j, d));
          r.out(b, h, i, d) = static_cast<T>(o);
        }
      }
    }
  return r;
}

template <typename T>
struct BruteForceGradients {
  Tensor<T, 4> dq;     // shape of q
  Tensor<T, 4> dk;     // shape of k
  Tensor<T, 4> dv;     // shape of v
  Tensor<T, 4> dbias;  // shape of opts.bias (summed over its broadcast dimensions), empty without a bias
  Tensor<T, 1> dsinks;  // (H) with opts.sinks, else empty
};

/// The gradients of sum(dout * out) from the definitions, per row in long double (no dropout):
///   dv_j += P_ij dO_i;   dP_ij = dO_i . v_j;   dS_ij = P_ij (dP_ij - sum_k P_ik dP_ik)
///   dq_i += scale dS_ij cap'_ij k_j;   dk_j += scale dS_ij cap'_ij q_i;   dbias_ij += dS_ij
///   dsink_h += P_sink (0 - sum_k P_ik dP_ik)   (a sink has no value: its dP is 0)
/// with P the probabilities of brute_force_attention and cap' the soft-cap's slope (1 without a cap); masked pairs
/// have P = 0 and contribute nothing.
template <typename T>
BruteForceGradients<T> brute_force_backward(const TensorView<const T, 4>& q, const TensorView<const T, 4>& k,
                                            const TensorView<const T, 4>& v, const TensorView<const T, 4>& dout,
                                            const AttentionOptions<T>& opts) {
  using Real = BruteForceRow::Real;
  const Index B = q.dim(0), H = q.dim(1), Lq = q.dim(2), D = q.dim(3), Hkv = k.dim(1), Lk = k.dim(2), Dv = v.dim(3);
  const Real scale = opts.scale ? static_cast<Real>(*opts.scale) : 1.0L / std::sqrt(static_cast<Real>(D));
  std::vector<Real> dq(static_cast<std::size_t>(q.size())), dk(static_cast<std::size_t>(k.size())),
      dv(static_cast<std::size_t>(v.size()));
  const bool bias = opts.bias.data() != nullptr;
  Tensor<Real, 4> dbias(bias ? opts.bias.shape() : std::array<Index, 4>{0, 0, 0, 0});
  std::vector<Real> dsinks(opts.sinks.size());
  const auto at = [](const std::array<Index, 4>& shape, Index a, Index b, Index c, Index d) {
    return static_cast<std::size_t>(((a * shape[1] + b) * shape[2] + c) * shape[3] + d);
  };
  for (Index b = 0; b < B; ++b)
    for (Index h = 0; h < H; ++h) {
      const Index hk = h / (H / Hkv);
      for (Index i = 0; i < Lq; ++i) {
        const BruteForceRow row = brute_force_row(q, k, opts, b, h, i);
        std::vector<Real> p(static_cast<std::size_t>(Lk)), dp(static_cast<std::size_t>(Lk));
        Real p_dot_dp = 0;
        for (Index j = 0; j < Lk; ++j) {
          p[static_cast<std::size_t>(j)] = row.probability(j);
          if (!row.on[static_cast<std::size_t>(j)]) continue;
          Real dot = 0;
          for (Index e = 0; e < Dv; ++e) dot += static_cast<Real>(dout(b, h, i, e)) * static_cast<Real>(v(b, hk, j, e));
          dp[static_cast<std::size_t>(j)] = dot;
          p_dot_dp += p[static_cast<std::size_t>(j)] * dot;
        }
        if (!dsinks.empty()) dsinks[static_cast<std::size_t>(h)] -= row.sink_probability() * p_dot_dp;
        for (Index j = 0; j < Lk; ++j) {
          if (!row.on[static_cast<std::size_t>(j)]) continue;
          const Real pij = p[static_cast<std::size_t>(j)], ds = pij * (dp[static_cast<std::size_t>(j)] - p_dot_dp);
          for (Index e = 0; e < Dv; ++e) dv[at(v.shape(), b, hk, j, e)] += pij * static_cast<Real>(dout(b, h, i, e));
          const Real dx = ds * row.cap_slope[static_cast<std::size_t>(j)];
          for (Index d = 0; d < D; ++d) {
            dq[at(q.shape(), b, h, i, d)] += scale * dx * static_cast<Real>(k(b, hk, j, d));
            dk[at(k.shape(), b, hk, j, d)] += scale * dx * static_cast<Real>(q(b, h, i, d));
          }
          if (bias) {
            const auto& shape = opts.bias.shape();
            dbias(shape[0] == 1 ? 0 : b, shape[1] == 1 ? 0 : h, shape[2] == 1 ? 0 : i, shape[3] == 1 ? 0 : j) += ds;
          }
        }
      }
    }
  const auto to_tensor = [](const std::vector<Real>& x, const std::array<Index, 4>& shape) {
    Tensor<T, 4> t(shape);
    for (std::size_t n = 0; n < x.size(); ++n) t.data()[n] = static_cast<T>(x[n]);
    return t;
  };
  BruteForceGradients<T> g{to_tensor(dq, q.shape()), to_tensor(dk, k.shape()), to_tensor(dv, v.shape()), {}, {}};
  if (!dsinks.empty()) {
    g.dsinks = Tensor<T, 1>({static_cast<Index>(dsinks.size())});
    for (std::size_t h = 0; h < dsinks.size(); ++h) g.dsinks.data()[h] = static_cast<T>(dsinks[h]);
  }
  if (bias) {
    g.dbias = Tensor<T, 4>(opts.bias.shape());
    for (Index n = 0; n < dbias.size(); ++n) g.dbias.data()[n] = static_cast<T>(dbias.data()[n]);
  }
  return g;
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
