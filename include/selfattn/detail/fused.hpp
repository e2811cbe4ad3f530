// selfattn/detail/fused.hpp — the fused, memory-efficient attention kernel: tiled online-softmax forward and
// recompute backward (FlashAttention-2 order), never holding an (Lq, Lk) matrix.
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
#include <selfattn/detail/reference.hpp>
#include <selfattn/detail/dropout.hpp>
#include <selfattn/detail/mask.hpp>
#include <selfattn/tensor.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <limits>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

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
  /// Calls with fewer nominal multiply-adds than this run on one thread: opening a parallel region costs about
  /// 1.5 us on an idle core and a scheduler time slice (0.2 to 1.4 ms measured) when the other core is busy,
  /// while 2^20 multiply-adds take about 20 us.
  static constexpr double parallel_min_work = 1 << 20;
};

/// The number of threads the fused kernel may use: OpenMP's count, or 1 without OpenMP.
inline int fused_max_threads() {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

inline int fused_thread_id() {
#ifdef _OPENMP
  return omp_get_thread_num();
#else
  return 0;
#endif
}

inline Index ceil_div(Index a, Index b) { return (a + b - 1) / b; }

/// Pointer to element (b, h, l, 0) of a rank-4 view.
template <typename T>
T* row_pointer(const TensorView<T, 4>& x, Index b, Index h, Index l) {
  return x.data() + b * x.stride(0) + h * x.stride(1) + l * x.stride(2);
}

/// Scratch memory of one forward thread: O(tile), independent of Lq and Lk.
template <typename T>
struct ForwardWorkspace {
  static constexpr Index lanes = FusedTiles<T>::lanes;
  micro::Buffer<T> qt;     // (D, lanes): the block's queries, transposed
  micro::Buffer<T> s;      // (forward_keys, lanes): scores, then probabilities, of one tile
  micro::Buffer<T> ot;     // (Dv, lanes): unnormalised output, transposed
  micro::Buffer<T> state;  // 5 x lanes: running max m, running sum l, rescale alpha, key range lo, hi

  ForwardWorkspace(Index head_dim, Index value_dim)
      : qt(static_cast<std::size_t>(head_dim * lanes)),
        s(static_cast<std::size_t>(FusedTiles<T>::forward_keys * lanes)),
        ot(static_cast<std::size_t>(value_dim * lanes)),
        state(static_cast<std::size_t>(5 * lanes)) {}

  static std::size_t bytes(Index head_dim, Index value_dim) {
    return sizeof(T) * static_cast<std::size_t>((head_dim + FusedTiles<T>::forward_keys + value_dim + 5) * lanes);
  }
};

/// Bytes of scratch memory one thread of fused_forward allocates (besides the outputs): O(tile), no Lq, no Lk.
template <typename T>
std::size_t fused_forward_workspace_bytes(Index head_dim, Index value_dim) {
  return ForwardWorkspace<T>::bytes(head_dim, value_dim);
}

/// The forward of one block of `lanes` query rows [i0, i0 + lanes) of (batch b, head h), over every key tile.
///   1. Q^T of the block: S^T = K Q^T then holds q_i . k_j in column i.
///   2. per key tile: S^T = scale K_tile Q^T (micro-kernel), masks (partial tiles: the per-row key range; `allowed`,
///      bias, ALiBi: per element), tile max per query lane
///   3. online softmax per lane: m' = max(m, tile max), alpha = exp(m - m'), l = alpha l + sum_j exp(s_ij - m'),
///      P_ij = exp(s_ij - m') (0 where masked), dropped entries (dropout stream) set to 0 in P after the sum
///   4. O^T = alpha O^T + V_tile^T P^T (micro-kernel; the safe one when the tile's values hold inf or NaN)
///   5. o_i = O_i / l_i * 1 / (1 - p), lse_i = m_i + log l_i; a row with l_i == 0 (no allowed key) gets o_i = 0,
///      lse_i = -inf.
template <typename T>
void fused_forward_block(const AttentionParams<T>& p, const ForwardOutputs<T>& result, Index b, Index h, Index i0,
                         ForwardWorkspace<T>& w) {
  using P = micro::Packet<T>;
  using namespace Eigen::internal;
  constexpr Index ps = micro::packet_size<T>;
  constexpr int nv = micro::micro_packets;
  constexpr Index lanes = FusedTiles<T>::lanes;
  constexpr Index tile_keys = FusedTiles<T>::forward_keys;
  constexpr T minus_infinity = -std::numeric_limits<T>::infinity();
  const MaskParams<T>& mask = p.mask;
  const Index rows = std::min(lanes, p.q_len() - i0);
  const Index head_dim = p.q.dim(3), value_dim = p.value_dim(), hk = p.kv_head(h);

  // 1. Q^T (D, lanes); lanes past the last row stay 0 (their results are never written).
  T* qt = w.qt.data();
  std::fill(w.qt.begin(), w.qt.end(), T(0));
  const T* q = row_pointer(p.q, b, h, i0);
  for (Index i = 0; i < rows; ++i)
    for (Index d = 0; d < head_dim; ++d) qt[d * lanes + i] = q[i * p.q.stride(2) + d];

  T* m = w.state.data();
  T* l = m + lanes;
  T* alpha = l + lanes;
  T* lo = alpha + lanes;
  T* hi = lo + lanes;
  std::fill(m, m + lanes, minus_infinity);
  std::fill(l, l + lanes, T(0));
  std::fill(w.ot.begin(), w.ot.end(), T(0));
  std::array<KeyRange, lanes> ranges{};
  for (Index i = 0; i < rows; ++i) ranges[static_cast<std::size_t>(i)] = mask.key_range(b, i0 + i);
  const KeyRange first = ranges[0], last = ranges[static_cast<std::size_t>(rows - 1)];
  const bool element_masks = mask.allowed.present() || mask.has_score_offset();

  const T* k = row_pointer(p.k, b, hk, 0);
  const T* v = row_pointer(p.v, b, hk, 0);
  const Index k_stride = p.k.stride(2), v_stride = p.v.stride(2);
  T* s = w.s.data();
  T* ot = w.ot.data();
  const P scale = pset1<P>(p.scale);
  // Key tiles from the first row's first key to the last row's last: nothing outside is visible to any row.
  for (Index j0 = first.begin; j0 < last.end; j0 += tile_keys) {
    const Index width = std::min(tile_keys, last.end - j0);
    const bool full = last.begin <= j0 && first.end >= j0 + width;  // inside every row's range

    // 2. S^T (width, lanes) = scale K_tile Q^T. The scale multiplies the finished dot product, exactly as in
    // the backward: both compute bitwise the same s_ij, so the backward's exp(s_ij - lse_i) sees the rounding
    // errors the forward's lse_i saw, and they cancel (as they do in the reference kernel).
    // The tile max per lane is taken here too, from the registers (exact for a full tile; a partial tile's
    // masks lower some scores, so its max is taken again after them).
    P tmax[nv];
    micro::unroll<nv>([&](auto c) { tmax[c] = pset1<P>(minus_infinity); });
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
    micro::gemm<T, nv>(false, width, head_dim, k + j0 * k_stride, k_stride, 1, qt, lanes, store_scores);
    const bool masked = !full || element_masks;
    if (!full) {  // the structural masks of a partial tile: keep lo_i <= jj < hi_i, per lane
      for (Index i = 0; i < lanes; ++i) {
        const KeyRange range = i < rows ? ranges[static_cast<std::size_t>(i)] : KeyRange{};  // padding: empty
        lo[i] = static_cast<T>(std::clamp<Index>(range.begin - j0, 0, width));
        hi[i] = static_cast<T>(std::clamp<Index>(range.end - j0, 0, width));
      }
      const P minus_inf = pset1<P>(minus_infinity);
      for (Index jj = 0; jj < width; ++jj) {
        const P key = pset1<P>(static_cast<T>(jj));
        for (Index c = 0; c < lanes; c += ps) {
          const P visible = pand(pcmp_le(ploadu<P>(lo + c), key), pcmp_lt(key, ploadu<P>(hi + c)));
          pstoreu(s + jj * lanes + c, pselect(visible, ploadu<P>(s + jj * lanes + c), minus_inf));
        }
      }
    }
    if (element_masks) {  // `allowed`, bias and ALiBi: per element, only when given
      for (Index jj = 0; jj < width; ++jj)
        for (Index i = 0; i < rows; ++i) {
          T& score = s[jj * lanes + i];
          if (score == minus_infinity) continue;
          if (!mask.element_allowed(b, h, i0 + i, j0 + jj))
            score = minus_infinity;
          else
            score += mask.score_offset(b, h, i0 + i, j0 + jj);
        }
    }

    // 3. Online softmax, one query per lane.
    for (Index c = 0; c < lanes; c += ps) {
      P tile_max = tmax[c / ps];
      if (masked) {
        tile_max = pset1<P>(minus_infinity);
        for (Index jj = 0; jj < width; ++jj) tile_max = pmax(tile_max, ploadu<P>(s + jj * lanes + c));
      }
      const P m_old = ploadu<P>(m + c);
      const P m_new = pmax(m_old, tile_max);
      // alpha = exp(m_old - m_new), selected to 0 while the lane has seen no key (m_old = -inf).
      const P a = micro::exp_or_zero<T>(m_old, m_new);
      pstoreu(alpha + c, a);
      pstoreu(m + c, m_new);
      P sum = pmul(a, ploadu<P>(l + c));
      for (Index jj = 0; jj < width; ++jj) {
        const P prob = micro::exp_or_zero<T>(ploadu<P>(s + jj * lanes + c), m_new);
        pstoreu(s + jj * lanes + c, prob);
        sum = padd(sum, prob);
      }
      pstoreu(l + c, sum);
    }
    if (p.dropout.active())  // the sum above is before dropout (lse and l are); the values see the kept ones
      for (Index jj = 0; jj < width; ++jj)
        for (Index i = 0; i < rows; ++i)
          if (!p.dropout.keep(b, h, i0 + i, j0 + jj)) s[jj * lanes + i] = T(0);

    // 4. O^T = alpha O^T + V_tile^T P^T: rows dv, depth the tile's keys, A(dv, j) = v_j[dv].
    const bool values_finite = micro::all_finite(v + j0 * v_stride, width, value_dim, v_stride);
    const auto rescale_and_add = [&](Index m0, auto& acc) SELFATTN_INLINE_LAMBDA {
      constexpr int R = static_cast<int>(std::extent_v<std::remove_reference_t<decltype(acc)>>);
      micro::unroll<R>([&](auto r) {
        T* row = ot + (m0 + r) * lanes;
        micro::unroll<nv>([&](auto c) {
          pstoreu(row + c * ps, pmadd(ploadu<P>(row + c * ps), ploadu<P>(alpha + c * ps), acc[r][c]));
        });
      });
    };
    micro::gemm<T, nv>(!values_finite, value_dim, width, v + j0 * v_stride, 1, v_stride, s, lanes, rescale_and_add);
  }

  // 5. Normalise and write out, lse.
  const T keep_scale = p.dropout.active() ? p.dropout.keep_scale() : T(1);
  for (Index i = 0; i < rows; ++i) {
    T* out = row_pointer(result.out, b, h, i0 + i);
    T& lse = result.lse.data()[b * result.lse.stride(0) + h * result.lse.stride(1) + (i0 + i) * result.lse.stride(2)];
    if (l[i] == T(0)) {  // no allowed key: 0, never 0 / 0
      for (Index d = 0; d < value_dim; ++d) out[d] = T(0);
      lse = minus_infinity;
      continue;
    }
    const T factor = keep_scale / l[i];
    for (Index d = 0; d < value_dim; ++d) out[d] = ot[d * lanes + i] * factor;
    lse = m[i] + std::log(l[i]);
  }
}

/// The fused forward: out and lse of every (batch, head, query row), never the weights. Threads share the
/// blocks of `lanes` query rows of every (batch, head); the most expensive (last, under a causal mask) first.
template <typename T>
void fused_forward(const AttentionParams<T>& p, const ForwardOutputs<T>& result) {
  constexpr Index lanes = FusedTiles<T>::lanes;
  const Index blocks = ceil_div(p.q_len(), lanes);
  const Index tasks = p.batch() * p.heads() * blocks;
  if (tasks == 0) return;
  const double work = static_cast<double>(tasks * lanes) * static_cast<double>(p.k_len()) *
                      static_cast<double>(p.q.dim(3) + p.value_dim());
  const int threads =
      work < FusedTiles<T>::parallel_min_work ? 1 : static_cast<int>(std::min<Index>(fused_max_threads(), tasks));
  std::vector<ForwardWorkspace<T>> workspaces;  // allocated before any thread starts: a bad_alloc throws here
  workspaces.reserve(static_cast<std::size_t>(threads));
  for (int t = 0; t < threads; ++t) workspaces.emplace_back(p.q.dim(3), p.value_dim());
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads) if (threads > 1)
#endif
  for (Index task = 0; task < tasks; ++task) {
    const Index block = blocks - 1 - task % blocks, bh = task / blocks;
    fused_forward_block(p, result, bh / p.heads(), bh % p.heads(), block * lanes,
                        workspaces[static_cast<std::size_t>(fused_thread_id())]);
  }
}

// ---- backward -------------------------------------------------------------------------------------------

/// Scratch memory of one backward thread: O(tile).
template <typename T>
struct BackwardWorkspace {
  static constexpr Index lanes = FusedTiles<T>::lanes;
  static constexpr Index rows = FusedTiles<T>::backward_rows;
  micro::Buffer<T> kt, vt, kn;  // K^T (D, lanes), V^T (Dv, lanes), K (lanes, Dp) of the tile, zero-padded
  micro::Buffer<T> dkt, dvt;    // dK^T (D, lanes), dV^T (Dv, lanes) accumulators of the tile
  micro::Buffer<T> s, ds;       // (rows, lanes): S -> P -> W (the dropped weights); dP -> dS

  BackwardWorkspace(Index head_dim, Index value_dim, Index padded_head_dim)
      : kt(static_cast<std::size_t>(head_dim * lanes)),
        vt(static_cast<std::size_t>(value_dim * lanes)),
        kn(static_cast<std::size_t>(lanes * padded_head_dim)),
        dkt(static_cast<std::size_t>(head_dim * lanes)),
        dvt(static_cast<std::size_t>(value_dim * lanes)),
        s(static_cast<std::size_t>(rows * lanes)),
        ds(static_cast<std::size_t>(rows * lanes)) {}
};

/// Where a backward thread accumulates what several tasks share: dQ (B, H, Lq, Dp) unscaled, and dbias
/// (in the bias's shape) when its broadcast makes tasks share elements.
template <typename T>
struct BackwardAccumulators {
  micro::Buffer<T> dq;
  micro::Buffer<T> dbias;
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
                         Index j0, BackwardWorkspace<T>& w, T* dq_acc, T* dbias_acc,
                         const std::array<Index, 4>& dbias_strides) {
  using P = micro::Packet<T>;
  using namespace Eigen::internal;
  constexpr Index ps = micro::packet_size<T>;
  constexpr int nv = micro::micro_packets;
  constexpr Index lanes = FusedTiles<T>::lanes;
  constexpr Index block_rows = FusedTiles<T>::backward_rows;
  constexpr T minus_infinity = -std::numeric_limits<T>::infinity();
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
  const bool element_masks = mask.allowed.present() || mask.has_score_offset();
  const T keep_scale = p.dropout.active() ? p.dropout.keep_scale() : T(1);
  const P minus_inf = pset1<P>(minus_infinity);
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
    for (Index i0 = ia; i0 < ib; i0 += block_rows) {
      const Index rows = std::min(block_rows, ib - i0);
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
        const T lse = g.lse.data()[b * g.lse.stride(0) + h * g.lse.stride(1) + i * g.lse.stride(2)];
        if (lse == minus_infinity) {  // a row without any allowed key: no gradient at all
          std::fill(s_row, s_row + lanes, T(0));
          continue;
        }
        for (Index c = 0; c < lanes; c += ps) pstoreu(s_row + c, pmul(ploadu<P>(s_row + c), scale));
        if (!full) {
          const KeyRange range = mask.key_range(b, i);
          const P lo = pset1<P>(static_cast<T>(std::clamp<Index>(range.begin - j0, 0, width)));
          const P hi = pset1<P>(static_cast<T>(std::clamp<Index>(range.end - j0, 0, width)));
          for (Index c = 0; c < lanes; c += ps) {
            const P key = plset<P>(static_cast<T>(c));
            const P visible = pand(pcmp_le(lo, key), pcmp_lt(key, hi));
            pstoreu(s_row + c, pselect(visible, ploadu<P>(s_row + c), minus_inf));
          }
        }
        if (element_masks)
          for (Index jj = 0; jj < width; ++jj) {
            T& score = s_row[jj];
            if (score == minus_infinity) continue;
            if (!mask.element_allowed(b, h, i, j0 + jj))
              score = minus_infinity;
            else
              score += mask.score_offset(b, h, i, j0 + jj);
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
        if (dbias_acc)
          for (Index jj = 0; jj < width; ++jj)
            dbias_acc[b * dbias_strides[0] + h * dbias_strides[1] + i * dbias_strides[2] + (j0 + jj) * dbias_strides[3]] +=
                ds_row[jj];
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
void fused_backward(const AttentionParams<T>& p, const BackwardTensors<T>& g) {
  constexpr Index lanes = FusedTiles<T>::lanes;
  constexpr Index ps = micro::packet_size<T>;
  const Index batch = p.batch(), heads = p.heads(), kv_heads = p.k.dim(1), q_len = p.q_len(), k_len = p.k_len();
  const Index head_dim = p.q.dim(3), value_dim = p.value_dim();
  const Index padded_dim = ceil_div(head_dim, ps) * ps;
  for (const TensorView<T, 4>& gradient : {g.dk, g.dv, g.dbias})
    std::fill(gradient.data(), gradient.data() + gradient.size(), T(0));  // contiguous, owned by the caller

  // D_i = rowsum(dO_i * O_i), once per row, summed in the order and with the instructions with which the
  // micro-kernel sums dP_ij = dO_i . v_j (chunks of dot_chunk; pmadd, an FMA where the target has one). Where
  // dS_ij = P_ij (dP_ij - D_i) cancels (rows dominated by a few keys), the roundings of the two then cancel
  // too, as they do in the reference kernel, whose two dot products share Eigen's order.
  std::vector<T> row_sums(static_cast<std::size_t>(batch * heads * q_len));
  for (Index b = 0; b < batch; ++b)
    for (Index h = 0; h < heads; ++h)
      for (Index i = 0; i < q_len; ++i)
        row_sums[static_cast<std::size_t>((b * heads + h) * q_len + i)] =
            micro::chunk_dot(row_pointer(g.dout, b, h, i), row_pointer(g.out, b, h, i), value_dim, FusedTiles<T>::dot_chunk);

  const Index tiles = ceil_div(k_len, lanes);
  const Index tasks = batch * kv_heads * tiles;
  const double work = static_cast<double>(batch * heads * q_len) * static_cast<double>(k_len) *
                      static_cast<double>(2 * head_dim + 3 * value_dim);
  const int threads = work < FusedTiles<T>::parallel_min_work
                          ? 1
                          : static_cast<int>(std::max<Index>(1, std::min<Index>(fused_max_threads(), tasks)));
  std::array<Index, 4> dbias_strides{};
  for (int d = 0; d < 4; ++d) dbias_strides[static_cast<std::size_t>(d)] = g.dbias.dim(d) == 1 ? 0 : g.dbias.stride(d);
  // A bias broadcast across what tasks split (batches, kv head groups, key tiles) makes tasks share dbias
  // elements: then each thread accumulates its own copy, summed in thread order at the end.
  const bool dbias_shared = g.dbias.data() && threads > 1 &&
                            ((g.dbias.dim(0) == 1 && batch > 1) || (g.dbias.dim(1) == 1 && kv_heads > 1) ||
                             (g.dbias.dim(3) == 1 && tiles > 1));
  std::vector<BackwardWorkspace<T>> workspaces;
  std::vector<BackwardAccumulators<T>> accumulators(static_cast<std::size_t>(threads));
  workspaces.reserve(static_cast<std::size_t>(threads));
  for (int t = 0; t < threads; ++t) {
    workspaces.emplace_back(head_dim, value_dim, padded_dim);
    accumulators[static_cast<std::size_t>(t)].dq.assign(static_cast<std::size_t>(batch * heads * q_len * padded_dim), T(0));
    if (dbias_shared) accumulators[static_cast<std::size_t>(t)].dbias.assign(static_cast<std::size_t>(g.dbias.size()), T(0));
  }

#ifdef _OPENMP
#pragma omp parallel for schedule(static, 1) num_threads(threads) if (threads > 1)
#endif
  for (Index task = 0; task < tasks; ++task) {
    const Index tile = task % tiles, bh = task / tiles;
    const auto t = static_cast<std::size_t>(fused_thread_id());
    T* dbias_target = dbias_shared ? accumulators[t].dbias.data() : g.dbias.data();
    fused_backward_tile(p, g, row_sums.data(), bh / kv_heads, bh % kv_heads, tile * lanes, workspaces[t],
                        accumulators[t].dq.data(), dbias_target, dbias_strides);
  }

  // dQ = scale * sum over threads, in thread order.
  for (Index b = 0; b < batch; ++b)
    for (Index h = 0; h < heads; ++h)
      for (Index i = 0; i < q_len; ++i) {
        T* dq = row_pointer(g.dq, b, h, i);
        const std::size_t at = static_cast<std::size_t>(((b * heads + h) * q_len + i) * padded_dim);
        for (Index d = 0; d < head_dim; ++d) {
          T sum = 0;
          for (const BackwardAccumulators<T>& a : accumulators) sum += a.dq[at + static_cast<std::size_t>(d)];
          dq[d] = p.scale * sum;
        }
      }
  if (dbias_shared)
    for (Index n = 0; n < g.dbias.size(); ++n) {
      T sum = 0;
      for (const BackwardAccumulators<T>& a : accumulators) sum += a.dbias[static_cast<std::size_t>(n)];
      g.dbias.data()[n] = sum;
    }
}

}  // namespace selfattn::detail
