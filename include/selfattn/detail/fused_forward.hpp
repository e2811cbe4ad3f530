// selfattn/detail/fused_forward.hpp — the fused forward kernel: tiled online softmax (FlashAttention), query rows
// in the SIMD lanes, O(tile) scratch memory; never holds an (Lq, Lk) matrix. Layout and tile sizes: fused_tiles.hpp.
#pragma once

#include <selfattn/detail/fused_tiles.hpp>
#include <selfattn/detail/mask.hpp>
#include <selfattn/detail/microkernels.hpp>
#include <selfattn/detail/params.hpp>
#include <selfattn/detail/softmax.hpp>
#include <selfattn/detail/threads.hpp>
#include <selfattn/detail/widen.hpp>
#include <selfattn/tensor.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

namespace selfattn::detail {

/// Scratch memory of one forward thread: O(tile), independent of Lq and Lk.
template <typename T>
struct ForwardWorkspace {
  static constexpr Index lanes = FusedTiles<T>::lanes;
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

  ForwardWorkspace() = default;
  ForwardWorkspace(Index head_dim, Index value_dim) { prepare(head_dim, value_dim); }

  /// Sizes (and zeroes) the buffers for one call; within their capacity nothing is allocated.
  void prepare(Index head_dim, Index value_dim) {
    qt.assign(static_cast<std::size_t>(head_dim * lanes), T(0));
    s.assign(static_cast<std::size_t>(FusedTiles<T>::forward_keys * lanes), T(0));
    ot.assign(static_cast<std::size_t>(value_dim * lanes), T(0));
    state.assign(static_cast<std::size_t>(5 * lanes), T(0));
  }

  static std::size_t bytes(Index head_dim, Index value_dim) {
    return sizeof(T) * static_cast<std::size_t>((head_dim + FusedTiles<T>::forward_keys + value_dim + 5) * lanes);
  }
};

/// Bytes of scratch memory one thread of fused_forward allocates (besides the outputs): O(tile), no Lq, no Lk.
template <typename T>
std::size_t fused_forward_workspace_bytes(Index head_dim, Index value_dim) {
  return ForwardWorkspace<T>::bytes(head_dim, value_dim);
}

/// The scratch of every thread of fused_forward, kept between calls (AttentionWorkspace). It only grows: a call
/// uses the first `threads` entries, so a call of the same shape as an earlier one allocates nothing.
template <typename T>
struct FusedForwardScratch {
  std::vector<ForwardWorkspace<T>> threads;
  // The bfloat16 products only (fused_forward_bf16.hpp): keys and values of every head as bfloat16 pairs.
  micro::Buffer<std::uint32_t> key_pairs;
  micro::Buffer<std::uint32_t> value_pairs;

  void prepare(int count, Index head_dim, Index value_dim) {
    if (threads.size() < static_cast<std::size_t>(count)) threads.resize(static_cast<std::size_t>(count));
    for (int t = 0; t < count; ++t) threads[static_cast<std::size_t>(t)].prepare(head_dim, value_dim);
  }
};

/// The products of the fused forward in T: the block's Q^T packed once (D, lanes), S^T = K_tile Q^T with K's
/// elements broadcast, O^T += V_tile^T P^T with V's elements broadcast (the safe micro-kernel when the tile's values
/// hold inf or NaN). Keys and values of T are read in place; stored in 16 bits (KV = bfloat16, float16; T = float),
/// each tile is widened into the thread's workspace as it is used, so the products are bitwise those on float inputs
/// holding the same values, in O(tile) memory. fused_forward_bf16.hpp has the other kind of products.
template <typename T, typename KV = T>
struct ElementProducts {
  static constexpr bool widens = !std::is_same_v<KV, T>;
  /// Tiles may start at any key.
  static constexpr Index key_alignment = 1;
  Index head_dim = 0, value_dim = 0;  // the tiles' widths, when widening

  /// The widened tiles, when KV is not T.
  void prepare(ForwardWorkspace<T>& w) const {
    if constexpr (widens) {
      w.key_tile.resize(static_cast<std::size_t>(FusedTiles<T>::forward_keys * head_dim));
      w.value_tile.resize(static_cast<std::size_t>(FusedTiles<T>::forward_keys * value_dim));
    } else {
      static_cast<void>(w);
    }
  }

  /// Q^T (D, lanes) of rows [i0, i0 + rows); lanes past the last row stay 0 (their results are never written).
  void load_queries(const AttentionParams<T, KV>& p, Index b, Index h, Index i0, Index rows,
                    ForwardWorkspace<T>& w) const {
    constexpr Index lanes = FusedTiles<T>::lanes;
    const Index depth = p.q.dim(3);
    T* qt = w.qt.data();
    std::fill(w.qt.begin(), w.qt.end(), T(0));
    const T* q = row_pointer(p.q, b, h, i0);
    for (Index i = 0; i < rows; ++i)
      for (Index d = 0; d < depth; ++d) qt[d * lanes + i] = q[i * p.q.stride(2) + d];
  }

  /// epilogue(m0, acc) over S^T (width, lanes) = K_tile Q^T, keys [j0, j0 + width) of key/value head (b, hk).
  template <typename Epilogue>
  void scores(const AttentionParams<T, KV>& p, Index b, Index hk, Index j0, Index width, ForwardWorkspace<T>& w,
              Epilogue& epilogue) const {
    const KV* k = row_pointer(p.k, b, hk, j0);
    const Index depth = p.q.dim(3);
    if constexpr (widens) {
      micro::widen_rows(k, p.k.stride(2), width, depth, w.key_tile.data());
      micro::gemm<T, micro::micro_packets>(false, width, depth, w.key_tile.data(), depth, 1, w.qt.data(),
                                           FusedTiles<T>::lanes, epilogue);
    } else {
      micro::gemm<T, micro::micro_packets>(false, width, depth, k, p.k.stride(2), 1, w.qt.data(),
                                           FusedTiles<T>::lanes, epilogue);
    }
  }

  /// epilogue(m0, acc) over V_tile^T P^T (Dv, lanes), P^T in w.s: A(dv, j) = v_j[dv].
  template <typename Epilogue>
  void values(const AttentionParams<T, KV>& p, Index b, Index hk, Index j0, Index width, ForwardWorkspace<T>& w,
              Epilogue& epilogue) const {
    const Index columns = p.value_dim();
    const T* v = nullptr;
    Index v_stride = 0;
    if constexpr (widens) {
      micro::widen_rows(row_pointer(p.v, b, hk, j0), p.v.stride(2), width, columns, w.value_tile.data());
      v = w.value_tile.data();
      v_stride = columns;
    } else {
      v = row_pointer(p.v, b, hk, j0);
      v_stride = p.v.stride(2);
    }
    const bool values_finite = micro::all_finite(v, width, columns, v_stride);
    micro::gemm<T, micro::micro_packets>(!values_finite, columns, width, v, 1, v_stride, w.s.data(),
                                         FusedTiles<T>::lanes, epilogue);
  }
};

/// The forward of one block of `lanes` query rows [i0, i0 + lanes) of (batch b, head h), over every key tile;
/// `products` computes the two products (ElementProducts, or the bfloat16 pairs of fused_forward_bf16.hpp).
///   1. Q^T of the block: S^T = K Q^T then holds q_i . k_j in column i.
///   2. per key tile: S^T = scale K_tile Q^T (products.scores), masks (partial tiles: the per-row key range; `allowed`,
///      bias, ALiBi: per element), tile max per query lane
///   3. online softmax per lane: m' = max(m, tile max), alpha = exp(m - m'), l = alpha l + sum_j exp(s_ij - m'),
///      P_ij = exp(s_ij - m') (0 where masked), dropped entries (dropout stream) set to 0 in P after the sum
///   4. O^T = alpha O^T + V_tile^T P^T (products.values)
///   5. finish_row (softmax.hpp): o_i = O_i / l_i * 1 / (1 - p), lse_i = m_i + log l_i; a row with l_i == 0 (no
///      allowed key) gets o_i = 0, lse_i = -inf.
template <typename T, typename KV, typename Products>
void fused_forward_block(const AttentionParams<T, KV>& p, const ForwardOutputs<T>& result, Index b, Index h, Index i0,
                         ForwardWorkspace<T>& w, const Products& products) {
  using P = micro::Packet<T>;
  using namespace Eigen::internal;
  constexpr Index ps = micro::packet_size<T>;
  constexpr int nv = micro::micro_packets;
  constexpr Index lanes = FusedTiles<T>::lanes;
  const Index rows = std::min(lanes, p.q_len() - i0);
  const Index value_dim = p.value_dim(), hk = p.kv_head(h);

  products.load_queries(p, b, h, i0, rows, w);  // 1.

  T* m = w.state.data();
  T* l = m + lanes;
  T* alpha = l + lanes;
  T* lo = alpha + lanes;
  T* hi = lo + lanes;
  std::fill(m, m + lanes, minus_infinity<T>);
  std::fill(l, l + lanes, T(0));
  std::fill(w.ot.begin(), w.ot.end(), T(0));
  std::array<RowMask<T>, lanes> row_masks{};
  for (Index i = 0; i < rows; ++i) row_masks[static_cast<std::size_t>(i)] = p.mask.row(b, h, i0 + i);
  const KeyRange first = row_masks[0].keys, last = row_masks[static_cast<std::size_t>(rows - 1)].keys;
  const bool element_masks = p.mask.has_element_masks() || p.mask.has_alibi();

  T* s = w.s.data();
  T* ot = w.ot.data();
  const P scale = pset1<P>(p.scale);
  // Key tiles from the first row's first key (down to the products' alignment) to the last row's last: nothing
  // outside is visible to any row.
  const Index start = first.begin - first.begin % Products::key_alignment;
  for (Index j0 = start; j0 < last.end; j0 += FusedTiles<T>::forward_keys) {
    const Index width = std::min(FusedTiles<T>::forward_keys, last.end - j0);
    const bool full = last.begin <= j0 && first.end >= j0 + width;  // inside every row's range

    // 2. S^T (width, lanes) = scale K_tile Q^T. The scale multiplies the finished dot product, exactly as in
    // the backward: both compute bitwise the same s_ij, so the backward's exp(s_ij - lse_i) sees the rounding
    // errors the forward's lse_i saw, and they cancel (as they do in the reference kernel).
    // The tile max per lane is taken here too, from the registers (exact for a full tile; a partial tile's
    // masks lower some scores, so its max is taken again after them).
    P tmax[nv];
    micro::unroll<nv>([&](auto c) { tmax[c] = pset1<P>(minus_infinity<T>); });
    const auto store_scores = [&](Index m0, auto& acc) SELFATTN_INLINE_LAMBDA {
      constexpr int R = static_cast<int>(std::extent_v<std::remove_reference_t<decltype(acc)>>);
      micro::unroll<R>([&](auto r) {
        micro::unroll<nv>([&](auto c) {
          const P score = pmul(acc[r][c], scale);
          tmax[c] = pmax(tmax[c], score);
          pstoreu(s + (m0 + r) * lanes + c * ps, score);
        });
      });
    };
    products.scores(p, b, hk, j0, width, w, store_scores);
    const bool masked = !full || element_masks;
    if (!full) {  // the structural masks of a partial tile: keep lo_i <= jj < hi_i, per lane
      for (Index i = 0; i < lanes; ++i) {
        const KeyRange range = i < rows ? row_masks[static_cast<std::size_t>(i)].keys : KeyRange{};  // padding: empty
        lo[i] = static_cast<T>(std::clamp<Index>(range.begin - j0, 0, width));
        hi[i] = static_cast<T>(std::clamp<Index>(range.end - j0, 0, width));
      }
      for (Index jj = 0; jj < width; ++jj) {
        const P key = pset1<P>(static_cast<T>(jj));
        for (Index c = 0; c < lanes; c += ps)
          pstoreu(s + jj * lanes + c, select_in_range<T>(ploadu<P>(s + jj * lanes + c), ploadu<P>(lo + c),
                                                         ploadu<P>(hi + c), key));
      }
    }
    if (element_masks)  // `allowed`, bias and ALiBi: per element, only when given
      for (Index jj = 0; jj < width; ++jj)
        for (Index i = 0; i < rows; ++i) {
          T& score = s[jj * lanes + i];
          if (score != minus_infinity<T>)
            score = p.mask.score(row_masks[static_cast<std::size_t>(i)], b, h, i0 + i, j0 + jj, score);
        }

    // 3. Online softmax, one query per lane.
    for (Index c = 0; c < lanes; c += ps) {
      P tile_max = tmax[c / ps];
      if (masked) {
        tile_max = pset1<P>(minus_infinity<T>);
        for (Index jj = 0; jj < width; ++jj) tile_max = pmax(tile_max, ploadu<P>(s + jj * lanes + c));
      }
      // m' = max(m, tile max); alpha = exp(m - m'), 0 while the lane has seen no key (softmax.hpp's rules).
      const micro::Rescale<T> rescale = micro::raise_max<T>(ploadu<P>(m + c), tile_max);
      pstoreu(alpha + c, rescale.alpha);
      pstoreu(m + c, rescale.max);
      P sum = pmul(rescale.alpha, ploadu<P>(l + c));
      for (Index jj = 0; jj < width; ++jj) {
        const P prob = micro::exp_or_zero<T>(ploadu<P>(s + jj * lanes + c), rescale.shift);
        pstoreu(s + jj * lanes + c, prob);
        sum = padd(sum, prob);
      }
      pstoreu(l + c, sum);
    }
    if (p.dropout.active())  // the sum above is before dropout (lse and l are); the values see the kept ones
      for (Index jj = 0; jj < width; ++jj)
        for (Index i = 0; i < rows; ++i)
          if (!p.dropout.keep(b, h, i0 + i, j0 + jj)) s[jj * lanes + i] = T(0);

    // 4. O^T = alpha O^T + V_tile^T P^T: rows dv, depth the tile's keys.
    const auto rescale_and_add = [&](Index m0, auto& acc) SELFATTN_INLINE_LAMBDA {
      constexpr int R = static_cast<int>(std::extent_v<std::remove_reference_t<decltype(acc)>>);
      micro::unroll<R>([&](auto r) {
        T* row = ot + (m0 + r) * lanes;
        micro::unroll<nv>([&](auto c) {
          pstoreu(row + c * ps, pmadd(ploadu<P>(row + c * ps), ploadu<P>(alpha + c * ps), acc[r][c]));
        });
      });
    };
    products.values(p, b, hk, j0, width, w, rescale_and_add);
  }

  // 5. Normalise and write out, lse.
  const T keep_scale = p.dropout.active() ? p.dropout.keep_scale() : T(1);
  for (Index i = 0; i < rows; ++i) {
    const FinishedRow<T> finished = finish_row(m[i], l[i], keep_scale);
    T* out = row_pointer(result.out, b, h, i0 + i);
    for (Index d = 0; d < value_dim; ++d) out[d] = finished.output(ot[d * lanes + i]);
    element(result.lse, b, h, i0 + i) = finished.lse;
  }
}

/// The fused forward: out and lse of every (batch, head, query row), never the weights. Threads share the
/// blocks of `lanes` query rows of every (batch, head); the most expensive (last, under a causal mask) first.
template <typename T, typename KV, typename Products>
void fused_forward_blocks(const AttentionParams<T, KV>& p, const ForwardOutputs<T>& result,
                          FusedForwardScratch<T>& scratch, const Products& products) {
  constexpr Index lanes = FusedTiles<T>::lanes;
  const Index blocks = ceil_div(p.q_len(), lanes);
  const Index tasks = p.batch() * p.heads() * blocks;
  if (tasks == 0) return;
  const double work = static_cast<double>(tasks * lanes) * static_cast<double>(p.k_len()) *
                      static_cast<double>(p.q.dim(3) + p.value_dim());
  const int threads = threads_for(work, tasks);
  scratch.prepare(threads, p.q.dim(3), p.value_dim());  // before any thread starts: a bad_alloc throws here
  for (int t = 0; t < threads; ++t) products.prepare(scratch.threads[static_cast<std::size_t>(t)]);
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads) if (threads > 1)
#endif
  for (Index task = 0; task < tasks; ++task) {
    const Index block = blocks - 1 - task % blocks, bh = task / blocks;
    fused_forward_block(p, result, bh / p.heads(), bh % p.heads(), block * lanes,
                        scratch.threads[static_cast<std::size_t>(thread_id())], products);
  }
}

/// The fused forward with the products in T (ElementProducts).
template <typename T>
void fused_forward(const AttentionParams<T>& p, const ForwardOutputs<T>& result, FusedForwardScratch<T>& scratch) {
  fused_forward_blocks(p, result, scratch, ElementProducts<T>{});
}

/// The fused forward on keys and values stored as KV (16 bits): each tile widened as it is used (ElementProducts).
template <typename T, typename KV>
void fused_forward_stored(const AttentionParams<T, KV>& p, const ForwardOutputs<T>& result,
                          FusedForwardScratch<T>& scratch) {
  fused_forward_blocks(p, result, scratch, ElementProducts<T, KV>{p.head_dim(), p.value_dim()});
}

/// fused_forward with scratch of its own, allocated for this call.
template <typename T>
void fused_forward(const AttentionParams<T>& p, const ForwardOutputs<T>& result) {
  FusedForwardScratch<T> scratch;
  fused_forward(p, result, scratch);
}

}  // namespace selfattn::detail
