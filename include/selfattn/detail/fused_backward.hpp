// selfattn/detail/fused_backward.hpp — the fused backward kernel: the forward's tiles in reverse, P recomputed from
// the saved lse (FlashAttention-2 order), keys in the SIMD lanes, O(tile) scratch memory per thread. Layout and tile
// sizes: fused_tiles.hpp.
#pragma once

#include <selfattn/detail/fused_tiles.hpp>
#include <selfattn/detail/mask.hpp>
#include <selfattn/detail/microkernels.hpp>
#include <selfattn/detail/params.hpp>
#include <selfattn/detail/softmax.hpp>
#include <selfattn/detail/threads.hpp>
#include <selfattn/tensor.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <limits>
#include <type_traits>
#include <vector>

namespace selfattn::detail {

/// Scratch memory of one backward thread: O(tile).
template <typename T>
struct BackwardWorkspace {
  static constexpr Index lanes = FusedTiles<T>::lanes;
  static constexpr Index rows = FusedTiles<T>::backward_rows;
  micro::Buffer<T> kt, vt, kn;  // K^T (D, lanes), V^T (Dv, lanes), K (lanes, Dp) of the tile, zero-padded
  micro::Buffer<T> dkt, dvt;    // dK^T (D, lanes), dV^T (Dv, lanes) accumulators of the tile
  micro::Buffer<T> s, ds;       // (rows, lanes): S -> P -> W (the dropped weights); dP -> dS

  BackwardWorkspace() = default;
  BackwardWorkspace(Index head_dim, Index value_dim, Index padded_head_dim) {
    prepare(head_dim, value_dim, padded_head_dim);
  }

  /// Sizes (and zeroes) the buffers for one call; within their capacity nothing is allocated.
  void prepare(Index head_dim, Index value_dim, Index padded_head_dim) {
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

/// The backward of one key tile [j0, j0 + lanes) of (batch b, kv head hk), over every head of the group and
/// every block of query rows that sees a key of the tile. The forward's passes in reverse, per block:
///   1. S = Q K_tile^T (micro-kernel), * scale, masks as in the forward; P = exp(s - lse_i) (0 where masked)
///   2. dP = dO V_tile^T (micro-kernel); with dropout dP_ij *= keep_ij / (1 - p), W_ij = P_ij keep_ij / (1 - p)
///   3. dS = P (dP - D_i), selected to 0 where P = 0 (a masked key's NaN value stays out); dbias += dS
///   4. dV^T += dO^T W, dK^T += Q^T dS (accumulated over the blocks and heads: the tile owns them)
///   5. dQ_block += dS K_tile, into this thread's dQ accumulator; the scale is applied when dQ, dK are written.
template <typename T>
void fused_backward_tile(const AttentionParams<T>& p, const BackwardTensors<T>& g, const T* row_sums, Index b, Index hk,
                         Index j0, BackwardWorkspace<T>& w, T* dq_acc, const Broadcast4<T>& dbias) {
  using P = micro::Packet<T>;
  using namespace Eigen::internal;
  constexpr Index ps = micro::packet_size<T>;
  constexpr int nv = micro::micro_packets;
  constexpr Index lanes = FusedTiles<T>::lanes;
  const MaskParams<T>& mask = p.mask;
  const Index head_dim = p.q.dim(3), value_dim = p.value_dim(), q_len = p.q_len();
  const Index padded_dim = ceil_div(head_dim, ps) * ps;
  const Index width = std::min(lanes, p.k_len() - j0);
  const Index j1 = j0 + width;

  // Pack the tile: K^T, V^T (lanes past the tile are 0) and K (rows of padded_dim, zero-padded).
  const T* k = row_pointer(p.k, b, hk, j0);
  const T* v = row_pointer(p.v, b, hk, j0);
  const Index k_stride = p.k.stride(2), v_stride = p.v.stride(2);
  T* kt = w.kt.data();
  T* vt = w.vt.data();
  T* kn = w.kn.data();
  std::fill(w.kt.begin(), w.kt.end(), T(0));
  std::fill(w.vt.begin(), w.vt.end(), T(0));
  std::fill(w.kn.begin(), w.kn.end(), T(0));
  for (Index jj = 0; jj < width; ++jj) {
    for (Index d = 0; d < head_dim; ++d) kt[d * lanes + jj] = kn[jj * padded_dim + d] = k[jj * k_stride + d];
    for (Index d = 0; d < value_dim; ++d) vt[d * lanes + jj] = v[jj * v_stride + d];
  }
  const bool keys_finite = micro::all_finite(k, width, head_dim, k_stride);
  std::fill(w.dkt.begin(), w.dkt.end(), T(0));
  std::fill(w.dvt.begin(), w.dvt.end(), T(0));
  T* s = w.s.data();
  T* ds = w.ds.data();
  const bool element_masks = mask.has_element_masks() || mask.has_alibi();
  const T keep_scale = p.dropout.active() ? p.dropout.keep_scale() : T(1);
  const P zero = pset1<P>(T(0));

  const Index group = p.heads() / p.k.dim(1);
  for (Index h = hk * group; h < (hk + 1) * group; ++h) {
    // The rows that see a key of the tile: end_i > j0 and begin_i < j1, a contiguous run (both ends rise with i).
    Index ia = 0, ib = q_len;
    {
      Index lo_i = 0, hi_i = q_len;
      while (lo_i < hi_i) {
        const Index mid = (lo_i + hi_i) / 2;
        if (mask.key_range(b, mid).end <= j0) lo_i = mid + 1; else hi_i = mid;
      }
      ia = lo_i;
      hi_i = q_len;
      while (lo_i < hi_i) {
        const Index mid = (lo_i + hi_i) / 2;
        if (mask.key_range(b, mid).begin < j1) lo_i = mid + 1; else hi_i = mid;
      }
      ib = lo_i;
    }
    for (Index i0 = ia; i0 < ib; i0 += FusedTiles<T>::backward_rows) {
      const Index rows = std::min(FusedTiles<T>::backward_rows, ib - i0);
      const KeyRange first = mask.key_range(b, i0), last = mask.key_range(b, i0 + rows - 1);
      const bool full = width == lanes && last.begin <= j0 && first.end >= j1;
      const T* q = row_pointer(p.q, b, h, i0);
      const T* dout = row_pointer(g.dout, b, h, i0);
      const Index q_stride = p.q.stride(2), dout_stride = g.dout.stride(2);

      // 1. S = Q K_tile^T, then P.
      const auto store_dots = [&](Index m0, auto& acc) SELFATTN_INLINE_LAMBDA {
        constexpr int R = static_cast<int>(std::extent_v<std::remove_reference_t<decltype(acc)>>);
        micro::unroll<R>([&](auto r) {
          micro::unroll<nv>([&](auto c) { pstoreu(s + (m0 + r) * lanes + c * ps, acc[r][c]); });
        });
      };
      micro::gemm<T, nv>(false, rows, head_dim, q, q_stride, 1, kt, lanes, store_dots);
      const P scale = pset1<P>(p.scale);
      for (Index r = 0; r < rows; ++r) {
        const Index i = i0 + r;
        T* s_row = s + r * lanes;
        const T lse = element(g.lse, b, h, i);
        if (lse == minus_infinity<T>) {  // a row without any allowed key: no gradient at all
          std::fill(s_row, s_row + lanes, T(0));
          continue;
        }
        for (Index c = 0; c < lanes; c += ps) pstoreu(s_row + c, pmul(ploadu<P>(s_row + c), scale));
        const RowMask<T> row = mask.row(b, h, i);
        if (!full) {
          const P lo = pset1<P>(static_cast<T>(std::clamp<Index>(row.keys.begin - j0, 0, width)));
          const P hi = pset1<P>(static_cast<T>(std::clamp<Index>(row.keys.end - j0, 0, width)));
          for (Index c = 0; c < lanes; c += ps)
            pstoreu(s_row + c, select_in_range<T>(ploadu<P>(s_row + c), lo, hi, plset<P>(static_cast<T>(c))));
        }
        if (element_masks)
          for (Index jj = 0; jj < width; ++jj) {
            T& score = s_row[jj];
            if (score != minus_infinity<T>) score = mask.score(row, b, h, i, j0 + jj, score);
          }
        const P lse_p = pset1<P>(lse);
        for (Index c = 0; c < lanes; c += ps) pstoreu(s_row + c, micro::exp_or_zero<T>(ploadu<P>(s_row + c), lse_p));
      }

      // 2. dP = dO V_tile^T, summed over Dv in chunks like D_i (see fused_backward).
      micro::gemm_store_chunked<T, nv>(rows, value_dim, FusedTiles<T>::dot_chunk, dout, dout_stride, 1, vt, lanes, ds,
                                       lanes);

      // 3. dS = P (dP - D_i), 0 where P = 0; W = P keep / (1 - p) replaces P.
      for (Index r = 0; r < rows; ++r) {
        const Index i = i0 + r;
        T* s_row = s + r * lanes;
        T* ds_row = ds + r * lanes;
        const P row_sum = pset1<P>(row_sums[(b * p.heads() + h) * q_len + i]);
        if (p.dropout.active()) {  // per element: dP_ij keep_ij / (1 - p), and W_ij in place of P_ij
          const T d_i = row_sums[(b * p.heads() + h) * q_len + i];
          for (Index jj = 0; jj < width; ++jj) {
            const bool keep = p.dropout.keep(b, h, i, j0 + jj);
            const T prob = s_row[jj];
            const T d_prob = keep ? ds_row[jj] * keep_scale : T(0);
            ds_row[jj] = prob == T(0) ? T(0) : prob * (d_prob - d_i);
            s_row[jj] = keep ? prob * keep_scale : T(0);
          }
        } else {
          for (Index c = 0; c < lanes; c += ps) {
            const P prob = ploadu<P>(s_row + c);
            pstoreu(ds_row + c, pselect(pcmp_eq(prob, zero), zero, pmul(prob, psub(ploadu<P>(ds_row + c), row_sum))));
          }
        }
        if (dbias.present())
          for (Index jj = 0; jj < width; ++jj) dbias(b, h, i, j0 + jj) += ds_row[jj];
      }

      // 4. dV^T += dO^T W (A(dv, i) = dO_i[dv]), dK^T += Q^T dS (A(d, i) = q_i[d]), over this block's rows.
      const bool dout_finite = micro::all_finite(dout, rows, value_dim, dout_stride);
      const bool q_finite = micro::all_finite(q, rows, head_dim, q_stride);
      micro::gemm_accumulate<T, nv>(!dout_finite, value_dim, rows, dout, 1, dout_stride, s, lanes, w.dvt.data(), lanes);
      micro::gemm_accumulate<T, nv>(!q_finite, head_dim, rows, q, 1, q_stride, ds, lanes, w.dkt.data(), lanes);

      // 5. dQ_block += dS K_tile (A(i, j) = dS_ij, B = K rows).
      micro::gemm_accumulate_wide<T>(!keys_finite, rows, padded_dim / ps, width, ds, lanes, 1, kn, padded_dim,
                                     dq_acc + ((b * p.heads() + h) * q_len + i0) * padded_dim, padded_dim);
    }
  }

  // dK = scale dK^T, dV = dV^T, transposed into the tile's rows (the tile owns them: no other task writes).
  for (Index jj = 0; jj < width; ++jj) {
    T* dk = row_pointer(g.dk, b, hk, j0 + jj);
    T* dv = row_pointer(g.dv, b, hk, j0 + jj);
    for (Index d = 0; d < head_dim; ++d) dk[d] = p.scale * w.dkt[static_cast<std::size_t>(d * lanes + jj)];
    for (Index d = 0; d < value_dim; ++d) dv[d] = w.dvt[static_cast<std::size_t>(d * lanes + jj)];
  }
}

/// The fused backward: dq, dk, dv (and dbias when g.dbias is given) from the forward's out and lse.
/// Threads share the key tiles of every (batch, kv head), statically (round robin), so that each thread's dQ
/// accumulator receives the same contributions in the same order on every call.
template <typename T>
void fused_backward(const AttentionParams<T>& p, const BackwardTensors<T>& g, FusedBackwardScratch<T>& scratch) {
  constexpr Index lanes = FusedTiles<T>::lanes;
  constexpr Index ps = micro::packet_size<T>;
  const Index batch = p.batch(), heads = p.heads(), kv_heads = p.k.dim(1), q_len = p.q_len(), k_len = p.k_len();
  const Index head_dim = p.q.dim(3), value_dim = p.value_dim();
  const Index padded_dim = ceil_div(head_dim, ps) * ps;
  for (const TensorView<T, 4>& gradient : {g.dk, g.dv, g.dbias}) set_zero(gradient);  // contiguous, the caller's

  // D_i = rowsum(dO_i * O_i), once per row, summed in the order and with the instructions with which the
  // micro-kernel sums dP_ij = dO_i . v_j (chunks of dot_chunk; pmadd, an FMA where the target has one). Where
  // dS_ij = P_ij (dP_ij - D_i) cancels (rows dominated by a few keys), the roundings of the two then cancel
  // too, as they do in the reference kernel, whose two dot products share Eigen's order.
  std::vector<T>& row_sums = scratch.row_sums;
  row_sums.assign(static_cast<std::size_t>(batch * heads * q_len), T(0));
  for (Index b = 0; b < batch; ++b)
    for (Index h = 0; h < heads; ++h)
      for (Index i = 0; i < q_len; ++i)
        row_sums[static_cast<std::size_t>((b * heads + h) * q_len + i)] =
            micro::chunk_dot(row_pointer(g.dout, b, h, i), row_pointer(g.out, b, h, i), value_dim, FusedTiles<T>::dot_chunk);

  const Index tiles = ceil_div(k_len, lanes);
  const Index tasks = batch * kv_heads * tiles;
  const double work = static_cast<double>(batch * heads * q_len) * static_cast<double>(k_len) *
                      static_cast<double>(2 * head_dim + 3 * value_dim);
  const int threads = threads_for(work, tasks);
  // A bias broadcast across what tasks split (batches, kv head groups, key tiles) makes tasks share dbias
  // elements: then each thread accumulates its own copy, summed in thread order at the end.
  const bool dbias_shared = g.dbias.data() && threads > 1 &&
                            ((g.dbias.dim(0) == 1 && batch > 1) || (g.dbias.dim(1) == 1 && kv_heads > 1) ||
                             (g.dbias.dim(3) == 1 && tiles > 1));
  std::vector<BackwardWorkspace<T>>& workspaces = scratch.workspaces;
  std::vector<BackwardAccumulators<T>>& accumulators = scratch.accumulators;  // entries [0, threads) are this call's
  grow_to(workspaces, threads);
  grow_to(accumulators, threads);
  for (int t = 0; t < threads; ++t) {
    workspaces[static_cast<std::size_t>(t)].prepare(head_dim, value_dim, padded_dim);
    accumulators[static_cast<std::size_t>(t)].dq.assign(static_cast<std::size_t>(batch * heads * q_len * padded_dim), T(0));
    if (dbias_shared) accumulators[static_cast<std::size_t>(t)].dbias.assign(static_cast<std::size_t>(g.dbias.size()), T(0));
  }

#ifdef _OPENMP
#pragma omp parallel for schedule(static, 1) num_threads(threads) if (threads > 1)
#endif
  for (Index task = 0; task < tasks; ++task) {
    const Index tile = task % tiles, bh = task / tiles;
    const auto t = static_cast<std::size_t>(thread_id());
    // dbias through the broadcast rule (mask.hpp), into this thread's copy when tasks share its elements.
    Broadcast4<T> dbias(g.dbias);
    if (dbias_shared) dbias.data = accumulators[t].dbias.data();
    fused_backward_tile(p, g, row_sums.data(), bh / kv_heads, bh % kv_heads, tile * lanes, workspaces[t],
                        accumulators[t].dq.data(), dbias);
  }

  // dQ = scale * sum over threads, in thread order.
  for (Index b = 0; b < batch; ++b)
    for (Index h = 0; h < heads; ++h)
      for (Index i = 0; i < q_len; ++i) {
        T* dq = row_pointer(g.dq, b, h, i);
        const std::size_t at = static_cast<std::size_t>(((b * heads + h) * q_len + i) * padded_dim);
        for (Index d = 0; d < head_dim; ++d) {
          T sum = 0;
          for (int t = 0; t < threads; ++t)
            sum += accumulators[static_cast<std::size_t>(t)].dq[at + static_cast<std::size_t>(d)];
          dq[d] = p.scale * sum;
        }
      }
  if (dbias_shared)
    for (Index n = 0; n < g.dbias.size(); ++n) {
      T sum = 0;
      for (int t = 0; t < threads; ++t) sum += accumulators[static_cast<std::size_t>(t)].dbias[static_cast<std::size_t>(n)];
      g.dbias.data()[n] = sum;
    }
}

/// fused_backward with scratch of its own, allocated for this call.
template <typename T>
void fused_backward(const AttentionParams<T>& p, const BackwardTensors<T>& g) {
  FusedBackwardScratch<T> scratch;
  fused_backward(p, g, scratch);
}

}  // namespace selfattn::detail
