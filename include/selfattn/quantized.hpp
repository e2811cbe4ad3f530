/// \file
/// int8 storage with a scale per block of 32 values: what an int8 KV cache (KVCache<float, std::int8_t>) holds.
///
/// A row of n floats is cut into blocks of int8_block = 32 values (the last one may be shorter). Block c gets the
/// scale s_c = absmax_c / 127, rounded up to a bfloat16, and each x_i of it is stored as
/// q_i = round(x_i / s_c), an int8 in [-127, 127] (llama.cpp's q8_0 layout, with a bfloat16 scale: float's range,
/// so tiny and huge rows quantise alike). Read back, x̂_i = s_c q_i is exact in float (8 significant bits times 8),
/// so every kernel computes on the same x̂ and differs from a float kernel given x̂ only by that kernel's rounding.
///
/// The error rule: |x_i - x̂_i| <= s_c / 2 (1 + 2^-16), with s_c <= absmax_c / 127 (1 + 2^-7) (plus 2^-133, the
/// smallest bfloat16, for blocks below 127 * 2^-126 = 1.5e-36, whose scales are subnormal). A block of zeros
/// has s_c = 0; a block holding a NaN or an infinity gets a NaN scale, so every x̂ of it is NaN (as a float cache
/// would hold a non-finite value there; attention never lets a masked one through). docs/int8_cache.md derives
/// what the rule means for attention's outputs.
/// \code
/// QuantizedTensor k8 = quantize_int8(k.view());           // k (B, H, L, D) -> values (B, H, L, D), scales (B, H, L,
/// ceil(D / 32)) Tensor<float, 4> back = dequantize_int8(k8.values.view(), k8.scales.view());   // x̂, exactly \endcode
#pragma once

#include <selfattn/errors.hpp>
#include <selfattn/half_precision.hpp>
#include <selfattn/tensor.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace selfattn {

/// Values per quantisation block of the int8 storage.
inline constexpr Index int8_block = 32;

/// Blocks (and so scales) of a row of n values: ceil(n / 32).
inline constexpr Index int8_blocks(Index n) { return (n + int8_block - 1) / int8_block; }

namespace detail {

/// The smallest bfloat16 >= x, for a finite x >= 0 (bfloat16 keeps a float's upper 16 bits: truncate, then step up
/// one unit where bits were dropped).
inline bfloat16 bfloat16_at_least(float x) {
  std::uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  const bool dropped = (bits & 0xffffu) != 0;
  bits = (bits >> 16) + (dropped ? 1u : 0u);
  return Eigen::numext::bit_cast<bfloat16>(static_cast<std::uint16_t>(bits));
}

/// The scale of one block of absolute maximum `absmax`: absmax / 127 rounded up to a bfloat16 (so |x / s| <= 127),
/// 0 for a block of zeros, NaN for a block with a NaN or an infinity.
inline bfloat16 int8_scale(float absmax) {
  if (!(absmax <= std::numeric_limits<float>::max())) return bfloat16(std::numeric_limits<float>::quiet_NaN());
  if (absmax == 0.0f) return bfloat16(0.0f);
  bfloat16 scale = bfloat16_at_least(absmax / 127.0f);
  // absmax / 127 rounded in float may fall below the exact quotient, and underflow to 0 for the tiniest blocks:
  // step up until 127 s covers absmax.
  while (static_cast<double>(static_cast<float>(scale)) * 127.0 < static_cast<double>(absmax))
    scale = Eigen::numext::bit_cast<bfloat16>(
        static_cast<std::uint16_t>(Eigen::numext::bit_cast<std::uint16_t>(scale) + 1u));
  return scale;
}

}  // namespace detail

/// x̂_i = s q_i: element i of a quantised row, exactly.
inline float dequantize_int8(const std::int8_t* q, const bfloat16* scales, Index i) {
  return static_cast<float>(scales[i / int8_block]) * static_cast<float>(q[i]);
}

namespace detail {

/// x = x̂ of int8 `values` (B, H, L, D) with their `scales`, row by row (shapes checked by the callers).
inline void dequantize_planes(const TensorView<const std::int8_t, 4>& values,
                              const TensorView<const bfloat16, 4>& scales, const TensorView<float, 4>& x) {
  for (Index b = 0; b < values.dim(0); ++b)
    for (Index h = 0; h < values.dim(1); ++h)
      for (Index l = 0; l < values.dim(2); ++l) {
        const std::int8_t* q = &values(b, h, l, 0);
        const bfloat16* s = &scales(b, h, l, 0);
        float* to = &x(b, h, l, 0);
        for (Index d = 0; d < values.dim(3); ++d) to[d] = dequantize_int8(q, s, d);
      }
}

}  // namespace detail

/// Quantises the n floats of x into q (n int8s) and scales (int8_blocks(n) bfloat16s), as the file's rule says.
inline void quantize_int8_row(const float* x, Index n, std::int8_t* q, bfloat16* scales) {
  for (Index c = 0; c * int8_block < n; ++c) {
    const Index begin = c * int8_block, end = std::min(n, begin + int8_block);
    float absmax = 0.0f;
    for (Index i = begin; i < end; ++i) absmax = std::isnan(x[i]) ? x[i] : std::max(absmax, std::abs(x[i]));
    const bfloat16 scale = detail::int8_scale(std::abs(absmax));
    scales[c] = scale;
    const float s = static_cast<float>(scale);
    for (Index i = begin; i < end; ++i) {
      // q = round(x / s), clamped to [-127, 127] (only a quotient rounded past 127 needs it); 0 without a finite s > 0.
      const float quotient = s > 0.0f ? x[i] / s : 0.0f;
      q[i] = static_cast<std::int8_t>(std::clamp(std::nearbyint(quotient), -127.0f, 127.0f));
    }
  }
}

/// \brief A float tensor stored as int8 values with a bfloat16 scale per block of 32 along the last dimension.
struct QuantizedTensor {
  Tensor<std::int8_t, 4> values;  ///< (B, H, L, D): q
  Tensor<bfloat16, 4> scales;     ///< (B, H, L, int8_blocks(D)): s
};

/// x (B, H, L, D) quantised row by row (quantize_int8_row).
inline QuantizedTensor quantize_int8(const TensorView<const float, 4>& x) {
  QuantizedTensor result{Tensor<std::int8_t, 4>(x.shape()),
                         Tensor<bfloat16, 4>({x.dim(0), x.dim(1), x.dim(2), int8_blocks(x.dim(3))})};
  std::vector<float> row(static_cast<std::size_t>(x.dim(3)));
  for (Index b = 0; b < x.dim(0); ++b)
    for (Index h = 0; h < x.dim(1); ++h)
      for (Index l = 0; l < x.dim(2); ++l) {
        for (Index d = 0; d < x.dim(3); ++d) row[static_cast<std::size_t>(d)] = x(b, h, l, d);
        quantize_int8_row(row.data(), x.dim(3), &result.values(b, h, l, 0), &result.scales(b, h, l, 0));
      }
  return result;
}

/// \overload
inline QuantizedTensor quantize_int8(const Tensor<float, 4>& x) { return quantize_int8(x.view()); }

/// The floats x̂ that int8 `values` (B, H, L, D) with their `scales` (B, H, L, int8_blocks(D)) stand for, exactly.
/// Throws ShapeError naming `scales` when its shape does not match.
inline Tensor<float, 4> dequantize_int8(const TensorView<const std::int8_t, 4>& values,
                                        const TensorView<const bfloat16, 4>& scales) {
  detail::check_shape<4>("dequantize_int8", "scales", scales.shape(),
                         {values.dim(0), values.dim(1), values.dim(2), int8_blocks(values.dim(3))});
  Tensor<float, 4> x(values.shape());
  detail::dequantize_planes(values, scales, x.view());
  return x;
}

}  // namespace selfattn
