// selfattn/detail/fused_scratch.hpp — the scratch memory of the fused forward and backward: per-thread tiles and
// accumulators kept between calls (AttentionWorkspace). The same types serve every instruction-set level; each
// level sizes them with its own tile widths (kernels/fused_tiles.inc) when a call starts.
#pragma once

#include <selfattn/detail/simd.hpp>
#include <selfattn/tensor.hpp>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace selfattn::detail {

/// Keys per tile of the fused forward, at every level (kernels/fused_tiles.inc says why 64).
inline constexpr Index forward_keys = 64;

/// Scratch memory of one forward thread: O(tile), independent of Lq and Lk.
template <typename T>
struct ForwardWorkspace {
  Index lanes = 0;  // the query rows of a block at the level that runs (FusedTiles<T>::lanes)
  micro::Buffer<T> qt;     // (D, lanes): the block's queries, transposed
  micro::Buffer<T> s;      // (forward_keys, lanes): scores, then probabilities, of one tile
  micro::Buffer<T> ot;     // (Dv, lanes): unnormalised output, transposed
  micro::Buffer<T> state;  // 5 x lanes: running max m, running sum l, rescale alpha, key range lo, hi
  // The bfloat16 products only (fused_forward_bf16.hpp): Q^T and P^T as bfloat16 pairs (ceil(D / 2), lanes) and
  // (forward_keys / 2, lanes). Empty otherwise.
  micro::Buffer<std::uint32_t> query_pairs;
  micro::Buffer<std::uint32_t> probability_pairs;
  // Keys and values stored in 16 bits, ElementProducts: the tile's K (forward_keys, D) and V (forward_keys, Dv)
  // widened to T. Empty otherwise.
  micro::Buffer<T> key_tile;
  micro::Buffer<T> value_tile;

  /// Sizes (and zeroes) the buffers for one call of blocks of `block_lanes` rows; within their capacity nothing is
  /// allocated.
  void prepare(Index head_dim, Index value_dim, Index block_lanes) {
    lanes = block_lanes;
    qt.assign(static_cast<std::size_t>(head_dim * lanes), T(0));
    s.assign(static_cast<std::size_t>(forward_keys * lanes), T(0));
    ot.assign(static_cast<std::size_t>(value_dim * lanes), T(0));
    state.assign(static_cast<std::size_t>(5 * lanes), T(0));
  }

  static std::size_t bytes(Index head_dim, Index value_dim, Index block_lanes) {
    return sizeof(T) * static_cast<std::size_t>((head_dim + forward_keys + value_dim + 5) * block_lanes);
  }
};

/// The scratch of every thread of fused_forward, kept between calls (AttentionWorkspace). It only grows: a call
/// uses the first `threads` entries, so a call of the same shape as an earlier one allocates nothing.
template <typename T>
struct FusedForwardScratch {
  std::vector<ForwardWorkspace<T>> threads;
  // The bfloat16 products only (fused_forward_bf16.hpp): keys and values of every head as bfloat16 pairs.
  micro::Buffer<std::uint32_t> key_pairs;
  micro::Buffer<std::uint32_t> value_pairs;

  void prepare(int count, Index head_dim, Index value_dim, Index lanes) {
    if (threads.size() < static_cast<std::size_t>(count)) threads.resize(static_cast<std::size_t>(count));
    for (int t = 0; t < count; ++t) threads[static_cast<std::size_t>(t)].prepare(head_dim, value_dim, lanes);
  }
};

/// Scratch memory of one backward thread: O(tile).
template <typename T>
struct BackwardWorkspace {
  micro::Buffer<T> kt, vt, kn;  // K^T (D, lanes), V^T (Dv, lanes), K (lanes, Dp) of the tile, zero-padded
  micro::Buffer<T> dkt, dvt;    // dK^T (D, lanes), dV^T (Dv, lanes) accumulators of the tile
  micro::Buffer<T> s, ds;       // (rows, lanes): S -> P -> W (the dropped weights); dP -> dS
  micro::Buffer<T> cap_slope;   // (rows, lanes) with soft-capping: 1 - tanh^2(x / c), the cap's derivative; else empty

  /// Sizes (and zeroes) the buffers for one call, for tiles of `lanes` keys and blocks of `rows` queries (the
  /// level's FusedTiles<T>); within their capacity nothing is allocated.
  void prepare(Index head_dim, Index value_dim, Index padded_head_dim, Index lanes, Index rows, bool softcap) {
    cap_slope.assign(softcap ? static_cast<std::size_t>(rows * lanes) : 0, T(0));
    kt.assign(static_cast<std::size_t>(head_dim * lanes), T(0));
    vt.assign(static_cast<std::size_t>(value_dim * lanes), T(0));
    kn.assign(static_cast<std::size_t>(lanes * padded_head_dim), T(0));
    dkt.assign(static_cast<std::size_t>(head_dim * lanes), T(0));
    dvt.assign(static_cast<std::size_t>(value_dim * lanes), T(0));
    s.assign(static_cast<std::size_t>(rows * lanes), T(0));
    ds.assign(static_cast<std::size_t>(rows * lanes), T(0));
  }
};

/// Where a backward thread accumulates what several tasks share: dQ (B, H, Lq, Dp) unscaled, and dbias
/// (in the bias's shape) when its broadcast makes tasks share elements.
template <typename T>
struct BackwardAccumulators {
  micro::Buffer<T> dq;
  micro::Buffer<T> dbias;
};

/// The fused backward's scratch, kept between calls (AttentionWorkspace): the row sums D_i, and each thread's
/// workspace and accumulators. The per-thread containers only grow (a call uses the first `threads` entries), and
/// buffers are re-assigned within their capacity, so a call of the same shape as an earlier one allocates nothing.
template <typename T>
struct FusedBackwardScratch {
  std::vector<T> row_sums;
  std::vector<BackwardWorkspace<T>> workspaces;
  std::vector<BackwardAccumulators<T>> accumulators;
};

}  // namespace selfattn::detail
