/// \file
/// Attention over int8 keys and values with a bfloat16 scale per block of 32 (quantized.hpp): what a step over an
/// int8 KV cache (KVCache<float, std::int8_t>) computes, for callers that keep quantised keys and values themselves.
#pragma once

#include <selfattn/attention.hpp>
#include <selfattn/quantized.hpp>

#include <array>
#include <cstdint>
#include <type_traits>

namespace selfattn {

/// \brief sdpa_forward with k and v stored as int8 values and block scales (quantize_int8): exactly sdpa_forward on
/// their dequantised floats x̂ = s q, without making them.
///
/// Few query rows (up to 16 per head: decoding) run the decode kernel, which reads the int8 values in place and
/// multiplies each packet by its block's scale: a quarter of the float bytes. More rows dequantise k and v once into
/// floats (O(Lk D) memory) for the fused kernel, or the reference when weights are wanted. docs/int8_cache.md.
///
/// Shapes: q (B, H, Lq, D), a float Tensor or TensorView; k.values (B, Hkv, Lk, D), k.scales (B, Hkv, Lk,
/// int8_blocks(D)); v.values (B, Hkv, Lk, Dv), v.scales (B, Hkv, Lk, int8_blocks(Dv)) -> out (B, H, Lq, Dv),
/// lse (B, H, Lq), weights when asked for. Throws like sdpa_forward, and ShapeError naming `k.scales` or `v.scales`.
/// \code
/// QuantizedTensor k8 = quantize_int8(k.view()), v8 = quantize_int8(v.view());
/// AttentionForward<float> fwd = sdpa_forward_int8(q, k8, v8);
/// \endcode
template <typename Q>
AttentionForward<float> sdpa_forward_int8(const Q& q, const QuantizedTensor& k, const QuantizedTensor& v,
                                          const AttentionOptions<float>& opts = {});

namespace detail {

// The body of sdpa_forward_int8, a template (of the query's element type, float) so that a file including this header
// compiles the int8 kernels only where it calls them: as an inline function it made every file that includes
// <selfattn/selfattn.hpp> compile them, 13.5 of its 13.9 s at g++ -O2 (AMD EPYC Zen 3, 2026-12-08).
template <typename T>
AttentionForward<float> sdpa_forward_int8_views(const TensorView<const T, 4>& q, const QuantizedTensor& k,
                                                const QuantizedTensor& v, const AttentionOptions<float>& opts) {
  static_assert(std::is_same_v<T, float>, "sdpa_forward_int8: q must be a float Tensor or TensorView of rank 4");
  const char* fn = "sdpa_forward_int8";
  detail::validate_forward_shapes(fn, q.shape(), k.values.shape(), v.values.shape(), opts);
  const auto scales_of = [](const Tensor<std::int8_t, 4>& values) {
    return std::array<Index, 4>{values.dim(0), values.dim(1), values.dim(2), int8_blocks(values.dim(3))};
  };
  detail::check_shape<4>(fn, "k.scales", k.scales.shape(), scales_of(k.values));
  detail::check_shape<4>(fn, "v.scales", v.scales.shape(), scales_of(v.values));
  AttentionForward<float> result;
  result.out = Tensor<float, 4>({q.dim(0), q.dim(1), q.dim(2), v.values.dim(3)});
  result.lse = Tensor<float, 3>({q.dim(0), q.dim(1), q.dim(2)});
  if (opts.need_weights) result.weights = Tensor<float, 4>({q.dim(0), q.dim(1), q.dim(2), k.values.dim(2)});
  detail::AttentionParams<float, std::int8_t> p =
      detail::make_stored_params<float, std::int8_t>(q, k.values, v.values, opts);
  p.k_scales = k.scales;
  p.v_scales = v.scales;
  AttentionWorkspace<float> workspace;
  detail::run_forward_stored(
      p, opts,
      detail::ForwardOutputs<float>{result.out.view(), result.lse.view(),
                                    opts.need_weights ? result.weights.view() : TensorView<float, 4>()},
      workspace);
  return result;
}

}  // namespace detail

template <typename Q>
AttentionForward<float> sdpa_forward_int8(const Q& q, const QuantizedTensor& k, const QuantizedTensor& v,
                                          const AttentionOptions<float>& opts) {
  return detail::sdpa_forward_int8_views(detail::const_view(q), k, v, opts);
}

}  // namespace selfattn
