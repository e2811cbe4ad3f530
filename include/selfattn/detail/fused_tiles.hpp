// selfattn/detail/fused_tiles.hpp — the layout and tile sizes shared by the fused forward (fused_forward.hpp) and
// backward (fused_backward.hpp): tiled online-softmax attention that never holds an (Lq, Lk) matrix.
//
// Same inputs, same masks (mask.hpp), same dropout stream (dropout.hpp) and same results as the reference
// kernel (detail/reference.hpp), which is the specification; tests/fused_test.cpp holds them together.
//
// Layout. Scores are computed transposed where that keeps the softmax vertical: the forward puts query rows
// in the SIMD lanes (a block of `lanes` queries, S^T = K Q^T), so the running max, running sum and rescale
// factor of each query are one lane and no horizontal reduction exists anywhere; K and V are read in place
// (as broadcast operands, any row stride) and only the block's Q^T is packed, once per block. The backward
// puts keys in the lanes (a tile of `lanes` keys, S = Q K^T), so dK and dV of the tile accumulate in place
// across every query block and head of the group, and Q and dO are read in place; only the tile's K^T, V^T
// and K are packed, once per tile. Every product is micro::gemm_panel (microkernels.hpp).
//
// Tile sizes (fp32, AVX-512: packets of 16; measured on the 2-core Xeon, docs/performance.md):
//   lanes     4 packets (64 floats), fixed by the micro-kernel's register budget (MR x 4 accumulators).
//   forward   64 keys per tile. Measured 32, 64 and 128 (N = 4096 and 2048, D = 64 and 128): all within the
//             machine's noise (107 to 127 GFLOP/s); 64 keeps Q^T (D x 64), the score tile (64 x 64) and O^T
//             (Dv x 64) at 16 KB each for D = 64, together the 48 KB L1 (128 doubles the score tile, 32 the
//             rescales of O^T).
//   backward  64 query rows per block, measured against 32 and 128 with the same outcome; P and dS blocks stay
//             16 KB each in L1 beside the tile's packed K^T, V^T, K and dK^T, dV^T accumulators (L1/L2).
// Masks. Structural masks (causal, window, key lengths) give each query row one key range (key_range); its
// ends rise with the row, so a block of rows x a tile of keys is empty (never visited), fully inside every
// row's range (no mask work at all unless `allowed`, a bias or ALiBi asks for per-element work), or partial
// (a vectorised compare against the per-row range). Masked scores are selected to -inf and their
// probabilities selected to 0, never computed; operands holding inf or NaN switch the products to the safe
// micro-kernel that skips zero factors, so a NaN in a masked key or value never reaches an output.
// Threads (OpenMP, when the user compiles with it): the forward over batch x heads x query blocks (each
// output row is computed by one thread in a fixed order: results do not depend on the thread count); the
// backward over batch x kv heads x key tiles, dQ accumulated in one buffer per thread and summed in thread
// order at the end (bitwise repeatable at a given thread count, equal across counts up to rounding).
#pragma once

#include <selfattn/detail/microkernels.hpp>
#include <selfattn/tensor.hpp>

namespace selfattn::detail {

/// Tile sizes of the fused kernel for element type T (see the file comment for the reasons).
template <typename T>
struct FusedTiles {
  /// SIMD lanes of one block: query rows in the forward, keys in the backward.
  static constexpr Index lanes = micro::micro_packets * micro::packet_size<T>;
  /// Keys per tile of the forward (rows of the transposed score tile).
  static constexpr Index forward_keys = 64;
  /// Query rows per block of the backward.
  static constexpr Index backward_rows = 64;
  /// The backward sums dP_ij = dO_i . v_j and D_i = dO_i . O_i over Dv in chunks of this many terms: their
  /// difference cancels when a few keys dominate a row, and chunked sums round about half as much (float
  /// errors then match the reference kernel's, whose Eigen dot products use 8 to 32 partial sums).
  static constexpr Index dot_chunk = 16;
};

}  // namespace selfattn::detail
