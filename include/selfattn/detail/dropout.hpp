/// \file
/// The counter-based random stream behind attention dropout.
/// No public names: everything here is internal (`selfattn::detail`), used by the kernels and the transformer layer.
///
/// Each probability P[b, h, i, j] is kept or dropped by a pure function of (seed, b, h, i, j): no state,
/// no generator to advance. So the backward regenerates the forward's mask without storing it, and
/// results do not depend on thread count, tiling or call order.
#pragma once

#include <selfattn/tensor.hpp>

#include <cstdint>

namespace selfattn::detail {

/// SplitMix64's finaliser: a bijective 64-bit mix with full avalanche (Steele, Lea, Flood 2014).
inline std::uint64_t mix64(std::uint64_t z) {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

/// Uniform in [0, 1) from the key (seed, b, h, i, j); 53 random bits.
inline double dropout_uniform(std::uint64_t seed, Index b, Index h, Index i, Index j) {
  std::uint64_t z = mix64(seed);
  for (Index part : {b, h, i, j}) z = mix64(z ^ static_cast<std::uint64_t>(part));
  return static_cast<double>(z >> 11) * 0x1.0p-53;
}

/// Dropout as kernels see it: keep(b, h, i, j) and the factor 1 / (1 - p) applied to kept entries.
template <typename T>
struct DropoutParams {
  T p = T(0);
  std::uint64_t seed = 0;

  bool active() const { return p > T(0); }
  bool keep(Index b, Index h, Index i, Index j) const { return dropout_uniform(seed, b, h, i, j) >= static_cast<double>(p); }
  T keep_scale() const { return T(1) / (T(1) - p); }
};

/// Dropout of activations (B, L, C), as the transformer layer applies it: element (b, l, c) is kept when a uniform
/// draw keyed by (seed, b, l, c) is >= p, and kept elements are scaled by 1 / (1 - p). One 64-bit mix per element:
/// the row's key is mixed once, then each column's draw mixes the key with the column.
///
/// The same call differentiates itself: y = x * mask / (1 - p) has dx = dy * mask / (1 - p), so the backward runs it
/// on the gradient with the forward's seed.
template <typename T>
void dropout_activations(const TensorView<T, 3>& x, T p, std::uint64_t seed) {
  if (!(p > T(0))) return;
  const T scale = T(1) / (T(1) - p);
  const double threshold = static_cast<double>(p);
  for (Index b = 0; b < x.dim(0); ++b)
    for (Index l = 0; l < x.dim(1); ++l) {
      const std::uint64_t row = mix64(mix64(seed ^ static_cast<std::uint64_t>(b)) ^ static_cast<std::uint64_t>(l));
      T* values = x.data() + b * x.stride(0) + l * x.stride(1);
      for (Index c = 0; c < x.dim(2); ++c) {
        const double u = static_cast<double>(mix64(row + static_cast<std::uint64_t>(c)) >> 11) * 0x1.0p-53;
        values[c] = u >= threshold ? values[c] * scale : T(0);
      }
    }
}

}  // namespace selfattn::detail
