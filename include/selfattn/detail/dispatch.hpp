// selfattn/detail/dispatch.hpp — the one place that decides which kernel runs: the instruction-set level (cpu.hpp's
// cpu_info().selected), the element type and the storage type. Everything below the public entries calls these.
//
//   float          the fused forward and backward at the selected level: isa_avx512 (also for avx512_bf16: the
//                  float kernels have no bfloat16 products), isa_avx2, or the generic kernels
//   double         the generic kernels (as compiled): the double paths are the tests' reference precision
//   16-bit K, V    float at the selected level, each tile widened as it is used; the bfloat16 dot products
//                  (fused_forward_bf16.hpp) only where bfloat16_products() says they are the faster path
//   decode         the three paths of the decode kernel (float, 16-bit K and V widened as read) at the selected
//                  level
//   linear         y = x W^T + b in float, and its backward's dx = dy W and dW = dy^T x (operands read through
//                  strides, StridedMatrix), at a dispatched level above the compiler's flags: that level's GEMM
//                  (kernels/gemm.inc); otherwise (generic, -march reaching the level, double) Eigen's, as compiled;
//                  for a few rows (a decode step's projections, weights of T or 16 bits) linear_few_rows at the
//                  selected level
#pragma once

#include <selfattn/cpu.hpp>
#include <selfattn/detail/kernels.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <type_traits>

namespace selfattn::detail {

/// f(level) with level the namespace tag of the float kernels to run: f(isa_avx512_tag{}) ..., or f(generic_tag{}).
struct generic_tag {};
struct avx2_tag {};
struct avx512_tag {};

template <typename T, typename F>
decltype(auto) at_kernel_level(F&& f) {
#if SELFATTN_DISPATCH_X86
  if constexpr (std::is_same_v<T, float>) {
    switch (cpu_info().selected) {
      case Isa::avx512:
      case Isa::avx512_bf16: return f(avx512_tag{});
      case Isa::avx2: return f(avx2_tag{});
      default: break;
    }
  }
#endif
  return f(generic_tag{});
}

/// Whether bfloat16 attention should use the BF16 dot products (vdpbf16ps, fused_forward_bf16.hpp) rather than
/// widen to float and use FMAs: only at the avx512_bf16 level and on CPUs where the instruction was measured faster
/// than the FMA (CpuInfo::bf16_products_faster; docs/dispatch.md has the table and the measurements).
inline bool bfloat16_products() {
  const CpuInfo& cpu = cpu_info();
  return cpu.selected == Isa::avx512_bf16 && cpu.bf16_products_faster;
}

/// Query rows per block of the fused forward (keys per tile of the backward) at the level that runs.
template <typename T>
Index fused_lanes() {
  return at_kernel_level<T>([](auto level) -> Index {
#if SELFATTN_DISPATCH_X86
    if constexpr (std::is_same_v<decltype(level), avx512_tag>) return isa_avx512::FusedTiles<T>::lanes;
    if constexpr (std::is_same_v<decltype(level), avx2_tag>) return isa_avx2::FusedTiles<T>::lanes;
#endif
    static_cast<void>(level);
    return FusedTiles<T>::lanes;
  });
}

/// Bytes of scratch memory one thread of fused_forward allocates (besides the outputs): O(tile), no Lq, no Lk.
template <typename T>
std::size_t fused_forward_workspace_bytes(Index head_dim, Index value_dim) {
  return ForwardWorkspace<T>::bytes(head_dim, value_dim, fused_lanes<T>());
}

/// The fused forward with the products in T.
template <typename T>
void fused_forward(const AttentionParams<T>& p, const ForwardOutputs<T>& result, FusedForwardScratch<T>& scratch) {
  at_kernel_level<T>([&](auto level) {
#if SELFATTN_DISPATCH_X86
    if constexpr (std::is_same_v<decltype(level), avx512_tag>)
      return isa_avx512::fused_forward_blocks(p, result, scratch, isa_avx512::ElementProducts<T>{});
    if constexpr (std::is_same_v<decltype(level), avx2_tag>)
      return isa_avx2::fused_forward_blocks(p, result, scratch, isa_avx2::ElementProducts<T>{});
#endif
    static_cast<void>(level);
    return fused_forward_blocks(p, result, scratch, ElementProducts<T>{});
  });
}

/// The fused forward on keys and values stored as KV (16 bits): each tile widened as it is used (ElementProducts).
/// With stored_query (a 16-bit call's q) the queries are read from it, a block at a time, and p.q gives only their
/// shape; out may be stored as KV too (rounded row by row). Neither then needs a float copy of the whole tensor.
template <typename T, typename KV, typename O>
void fused_forward_stored(const AttentionParams<T, KV>& p, const ForwardOutputs<T, O>& result,
                          FusedForwardScratch<T>& scratch, const TensorView<const KV, 4>& stored_query = {}) {
  at_kernel_level<T>([&](auto level) {
#if SELFATTN_DISPATCH_X86
    if constexpr (std::is_same_v<decltype(level), avx512_tag>)
      return isa_avx512::fused_forward_blocks(
          p, result, scratch, isa_avx512::ElementProducts<T, KV>{p.head_dim(), p.value_dim(), stored_query});
    if constexpr (std::is_same_v<decltype(level), avx2_tag>)
      return isa_avx2::fused_forward_blocks(
          p, result, scratch, isa_avx2::ElementProducts<T, KV>{p.head_dim(), p.value_dim(), stored_query});
#endif
    static_cast<void>(level);
    return fused_forward_blocks(p, result, scratch, ElementProducts<T, KV>{p.head_dim(), p.value_dim(), stored_query});
  });
}

/// fused_forward with scratch of its own, allocated for this call.
template <typename T>
void fused_forward(const AttentionParams<T>& p, const ForwardOutputs<T>& result) {
  FusedForwardScratch<T> scratch;
  fused_forward(p, result, scratch);
}

/// The fused backward: dq, dk, dv (and dbias) from the saved out and lse.
template <typename T>
void fused_backward(const AttentionParams<T>& p, const BackwardTensors<T>& g, FusedBackwardScratch<T>& scratch) {
  at_kernel_level<T>([&](auto level) {
#if SELFATTN_DISPATCH_X86
    if constexpr (std::is_same_v<decltype(level), avx512_tag>) return isa_avx512::fused_backward_blocks(p, g, scratch);
    if constexpr (std::is_same_v<decltype(level), avx2_tag>) return isa_avx2::fused_backward_blocks(p, g, scratch);
#endif
    static_cast<void>(level);
    return fused_backward_blocks(p, g, scratch);
  });
}

/// y (rows, out) (+)= x (rows, depth) W^T + b at the dispatched level, x and W (out, depth) read through strides
/// (StridedMatrix: a transposed operand without a copy), y's rows ldy apart, bias null or (out); accumulate adds to
/// y. False, doing nothing, where the caller's Eigen GEMM is at least as wide (the generic level, a build whose flags
/// reach the selected level, double): the caller then runs Eigen's.
template <typename T>
bool gemm_at_level([[maybe_unused]] Index rows, [[maybe_unused]] Index out, [[maybe_unused]] Index depth,
                   [[maybe_unused]] const StridedMatrix<T>& x, [[maybe_unused]] const StridedMatrix<T>& w,
                   [[maybe_unused]] const T* bias, [[maybe_unused]] T* y, [[maybe_unused]] Index ldy,
                   [[maybe_unused]] bool accumulate) {
  if (std::min(cpu_info().selected, Isa::avx512) <= compiled_level()) return false;
  return at_kernel_level<T>([&](auto level) {
#if SELFATTN_DISPATCH_X86
    if constexpr (std::is_same_v<decltype(level), avx512_tag>) {
      isa_avx512::gemm_strided(rows, out, depth, x, w, bias, y, ldy, accumulate);
      return true;
    }
    if constexpr (std::is_same_v<decltype(level), avx2_tag>) {
      isa_avx2::gemm_strided(rows, out, depth, x, w, bias, y, ldy, accumulate);
      return true;
    }
#endif
    static_cast<void>(level);
    return false;
  });
}

/// y (rows, out) = x (rows, depth) W^T + b at the dispatched level (gemm_at_level), rows ld* elements apart and
/// elements contiguous; false where the caller runs Eigen's GEMM.
template <typename T>
bool linear_at_level(Index rows, Index out, Index depth, const T* x, Index ldx, const T* w, Index ldw, const T* bias,
                     T* y, Index ldy) {
  return gemm_at_level<T>(rows, out, depth, StridedMatrix<T>{x, ldx, 1}, StridedMatrix<T>{w, ldw, 1}, bias, y, ldy,
                          false);
}

/// The decode kernel's path `path` over keys and values stored as KV, at the selected level: the driver and the path
/// of one level together (a path's lane-major partials are in that level's packets).
template <typename T, typename KV>
void decode_at_level(DecodePath path, const AttentionParams<T, KV>& p, const ForwardOutputs<T>& result,
                     DecodeScratch<T>& scratch) {
  at_kernel_level<T>([&](auto level) {
#if SELFATTN_DISPATCH_X86
    if constexpr (std::is_same_v<decltype(level), avx512_tag>)
      return isa_avx512::run_decode_path(path, p, result, scratch);
    if constexpr (std::is_same_v<decltype(level), avx2_tag>)
      return isa_avx2::run_decode_path(path, p, result, scratch);
#endif
    static_cast<void>(level);
    return run_decode_path(path, p, result, scratch);
  });
}

/// y_r = x_r W^T + b for a few rows (kernels/linear_few_rows.inc) at the selected level: W and b stored as S (T, or
/// 16 bits widened to T = float).
template <typename T, typename S>
void linear_few_rows_at_level(const std::array<const T*, few_rows_max>& x_rows,
                              const std::array<T*, few_rows_max>& y_rows, Index rows, Index in,
                              const TensorView<const S, 2>& weight, const TensorView<const S, 1>& bias) {
  at_kernel_level<T>([&](auto level) {
#if SELFATTN_DISPATCH_X86
    if constexpr (std::is_same_v<decltype(level), avx512_tag>)
      return isa_avx512::linear_few_rows<T, S>(x_rows, y_rows, rows, in, weight, bias);
    if constexpr (std::is_same_v<decltype(level), avx2_tag>)
      return isa_avx2::linear_few_rows<T, S>(x_rows, y_rows, rows, in, weight, bias);
#endif
    static_cast<void>(level);
    return linear_few_rows<T, S>(x_rows, y_rows, rows, in, weight, bias);
  });
}

/// fused_backward with scratch of its own, allocated for this call.
template <typename T>
void fused_backward(const AttentionParams<T>& p, const BackwardTensors<T>& g) {
  FusedBackwardScratch<T> scratch;
  fused_backward(p, g, scratch);
}

}  // namespace selfattn::detail
