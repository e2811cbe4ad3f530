// selfattn/detail/decode_grouped.hpp — the grouped decode path: every query row that shares a key/value head,
// against one chunk of that head's keys, without copying keys or values of T anywhere (16-bit ones are widened a
// chunk at a time, GroupedDecode). Chunks, merge: decode.hpp.
//
// Grouped-query decoding has G = H / Hkv query heads (times the Lq rows of the step) per key/value head. Each key
// and value row serves all R = G * Lq of them, so the step does 4 R D flops per key row of 2 D elements: for
// R = 16 that is 8 flops per byte, and the kernel is bound by arithmetic, not by memory. Eigen's GEMM spends
// most of its time on such small products packing the operands; this kernel packs nothing but the queries
// (once per call) and puts the R query rows in the SIMD lanes ("rows in lanes"):
//
//   q^T   (D, Rp)     qt[d * Rp + r] = q_r[d]; rows padded with zeros to Rp, a multiple of the packet
//   S^T   (n, Rp)     S^T[j] = scale * sum_d k_j[d] * q^T[d]: one FMA per (key, d) and packet, the key element
//                     broadcast straight from the cache (K is read once, in place, row by row), the scale applied
//                     to the finished sum: bitwise the fused kernels' scores (the same FMAs in the same order),
//                     so the fused backward, recomputing them from this kernel's lse, sees the rounding it saw
//   P^T   (n, Rp)     exp(S^T[j] - m) in the same buffer, m the per-lane (= per-row) maximum over the chunk
//   O^T   (Dv, Rp)    O^T[e] = sum_j v_j[e] * P^T[j]: one FMA per (key, e) and packet, the value element broadcast
//                     straight from the cache (V read once, in place)
//
// Both products are micro::micro_kernel (microkernels.hpp) with a different operand as "A": the cache rows
// give the broadcast scalars, the lane-major queries or probabilities give the packets. The softmax, the
// masks are per lane, hence vertical packet operations with no shuffles. A chunk's scores stay in L1 (256 keys
// x 16 float lanes: 16 KB).
#pragma once

#include <selfattn/detail/decode_rows.hpp>
#include <selfattn/detail/mask.hpp>
#include <selfattn/detail/kernels.hpp>
#include <selfattn/detail/params.hpp>
#include <selfattn/detail/simd.hpp>
#include <selfattn/detail/softmax.hpp>
#include <selfattn/detail/kernels.hpp>
#include <selfattn/tensor.hpp>

#include <Eigen/Core>

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

namespace selfattn::detail {
namespace micro {

/// Register tile of the grouped kernel: keys (pass 1) or value columns (pass 3) per tile when the rows take NV
/// packets, MR x NV = 4 accumulators. Small on purpose: every row of the tile is a separate stream of
/// broadcasts, and wider tiles measured slower, from memory (AMD Zen 4, 32k keys, G = 16, float: 84 GFLOP/s
/// at 4 keys, 66 at 8, 41 at 24) and from cache (105, 101, 90 GFLOP/s).
template <int NV>
inline constexpr int grouped_tile = std::max(1, 4 / NV);

/// Steps of a micro-kernel's depth loop per prefetched cache line (LinePrefetcher): one line per 4 steps of
/// 4 FMAs is about 14 GB/s at this core's FMA rate, the rate the kernel consumes K and V at.
inline constexpr int grouped_prefetch_period = 4;

/// The query rows of one (batch, key/value head) laid out for the grouped kernel, one row per lane, with their
/// masks (DecodeRows) as lanes. Lanes >= rows are padding: q = 0, visible everywhere, no ALiBi.
template <typename T>
struct GroupedQueries {
  Index lanes = 0;           ///< Rp: R rounded up to whole packets
  Index depth = 0;           ///< D
  Buffer<T> qt;              ///< (D, Rp): qt[d * Rp + r] = q_r[d]
  T scale = T(1);            ///< s = scale * q . k, applied to the finished dot product
  Buffer<T> key_begin;       ///< (Rp): first key the row may see (its structural key range), as T
  Buffer<T> key_end;         ///< (Rp): one past its last key
  Buffer<T> slope;           ///< (Rp): ALiBi slope of the row's head, when alibi
  Buffer<T> diagonal;        ///< (Rp): i + Lk - Lq of the row, when alibi
  bool alibi = false;        ///< whether s_ij -= slope * |diagonal - j|
};

/// The rows of one chunk the products read: key lo at keys (row stride ldk), value lo at values (row stride ldv).
/// The cache's own rows for keys and values of T; for 16-bit ones, their copy widened into the thread's scratch.
template <typename T>
struct ChunkRows {
  const T* keys;
  Index ldk;
  const T* values;
  Index ldv;
};

/// Lanes [v0, v0 + NV packets) of the grouped kernel over the keys [lo, hi) of a chunk, read from `rows`; the
/// prefetchers read ahead in the cache itself (chunk, of storage type KV). chunk.masked: some row does not see
/// every key of [lo, hi) (check key ranges, skip zero probabilities).
template <typename T, int NV, typename KV>
void grouped_lanes(const GroupedQueries<T>& q, Index v0, const DecodeChunk<KV>& chunk, const ChunkRows<T>& rows,
                   Index value_dim, T* scores, const DecodePartial<T>& part) {
  using namespace Eigen::internal;
  using P = Packet<T>;
  constexpr Index ps = packet_size<T>;
  constexpr int MR = grouped_tile<NV>;
  const Index lo = chunk.lo, hi = chunk.hi, lanes = q.lanes, n = hi - lo;
  const bool masked = chunk.masked;
  const P minus_infinity = pset1<P>(-std::numeric_limits<T>::infinity());
  const T* qt = q.qt.data() + v0 * ps;
  T* st = scores + v0 * ps;

  // The hardware prefetchers do not keep up with a few rows read in parallel (nor with V read by columns,
  // below): measured on Zen 4, G = 16, 32k keys, one thread, 50 GFLOP/s with K and V from memory against 105
  // from cache. So the first lane group prefetches the next chunk (the next task of this thread under a static
  // schedule) line by line while it computes: its keys during pass 1, its values during pass 3 (84 GFLOP/s).
  using Prefetcher = LinePrefetcher<KV, grouped_prefetch_period>;
  Prefetcher next_keys, next_values;
  if (v0 == 0) {
    next_keys = Prefetcher(chunk.k, chunk.ldk, q.depth, hi, chunk.next_end);
    next_values = Prefetcher(chunk.v, chunk.ldv, value_dim, hi, chunk.next_end);
  }

  // Pass 1. s_rj = scale q_r . k_j (+ ALiBi, -inf where masked) for the keys of the chunk, and the row maxima.
  const P scale = pset1<P>(q.scale);
  P begin[NV], end[NV], slope[NV], diagonal[NV], row_max[NV];
  unroll<NV>([&](auto w) {
    begin[w] = ploadu<P>(q.key_begin.data() + (v0 + w) * ps);
    end[w] = ploadu<P>(q.key_end.data() + (v0 + w) * ps);
    slope[w] = q.alibi ? ploadu<P>(q.slope.data() + (v0 + w) * ps) : pset1<P>(T(0));
    diagonal[w] = q.alibi ? ploadu<P>(q.diagonal.data() + (v0 + w) * ps) : pset1<P>(T(0));
    row_max[w] = minus_infinity;
  });
  for_each_tile<MR>(n, [&](auto tile, Index j0) SELFATTN_INLINE_LAMBDA {
    constexpr int M = decltype(tile)::value;
    P acc[M][NV];
    // A(m, d) = k_{lo + j0 + m}[d] (row stride ldk); B(d, lanes) = q^T.
    micro_kernel<T, M, NV, false>(q.depth, rows.keys + j0 * rows.ldk, rows.ldk, 1, qt, lanes, acc, next_keys);
    unroll<M>([&](auto m) {
      const P key = pset1<P>(static_cast<T>(lo + j0 + m));
      unroll<NV>([&](auto w) {
        P s = pmul(acc[m][w], scale);
        if (q.alibi) s = minus_alibi(s, slope[w], diagonal[w], key);
        if (masked) s = select_in_range<T>(s, begin[w], end[w], key);
        row_max[w] = pmax(row_max[w], s);
        pstoreu(st + (j0 + m) * lanes + w * ps, s);
      });
    });
  });

  // Pass 2. p_rj = exp(s_rj - m_r), exactly 0 where s_rj = -inf; a row without any key uses m = 0 (no -inf - -inf).
  P row_sum[NV], shift[NV];
  unroll<NV>([&](auto w) {
    shift[w] = softmax_shift<T>(row_max[w]);
    row_sum[w] = pset1<P>(T(0));
  });
  for (Index j = 0; j < n; ++j)
    unroll<NV>([&](auto w) {
      T* s = st + j * lanes + w * ps;
      const P probability = exp_or_zero<T>(ploadu<P>(s), shift[w]);
      row_sum[w] = padd(row_sum[w], probability);
      pstoreu(s, probability);
    });
  unroll<NV>([&](auto w) {
    pstoreu(part.max + (v0 + w) * ps, row_max[w]);
    pstoreu(part.sum + (v0 + w) * ps, row_sum[w]);
  });

  // Pass 3. o_r = sum_j p_rj v_j as O^T (Dv, lanes): A(e, j) = v_{lo + j}[e] read in place, B(j, lanes) = P^T.
  // With masks a probability may be 0 because its key is masked: such products are skipped, not added as
  // 0 * v (a NaN value there must not reach the output); micro_kernel<Safe> does that bitwise-equally.
  // Column tiles outermost, each over all keys of the chunk: V is read by columns, many rows at once, which
  // keeps many cache misses in flight (blocking the keys by 16 to 64 for locality measured 25 % slower).
  auto values = [&](auto safe) SELFATTN_INLINE_LAMBDA {
    for_each_tile<MR>(value_dim, [&](auto tile, Index e0) SELFATTN_INLINE_LAMBDA {
      constexpr int M = decltype(tile)::value;
      P acc[M][NV];
      micro_kernel<T, M, NV, decltype(safe)::value>(n, rows.values + e0, 1, rows.ldv, st, lanes, acc, next_values);
      unroll<M>([&](auto m) {
        unroll<NV>([&](auto w) { pstoreu(part.acc + (e0 + m) * lanes + (v0 + w) * ps, acc[m][w]); });
      });
    });
  };
  with_flag(masked, values);
}

}  // namespace micro

/// The grouped path as decode.hpp's driver runs it: R = G * Lq rows in SIMD lanes, K and V read in place once
/// per chunk. Partials are lane-major: acc (Dv, lanes). KV: the storage type of keys and values; 16-bit ones are
/// widened a chunk at a time into the thread's scratch (one conversion per element, where broadcasting a 16-bit
/// element costs one per multiply-add: measured 0.67x the float cache's speed at G = 16 before this copy).
template <typename T, typename KV = T>
struct GroupedDecode {
  using Queries = micro::GroupedQueries<T>;
  static constexpr bool widens = !std::is_same_v<KV, T>;

  static Index lanes(Index rows) { return ceil_div(rows, micro::packet_size<T>) * micro::packet_size<T>; }
  static constexpr bool lane_major = true;
  /// The scores (chunk x lanes) and, for a 16-bit KV, the chunk's keys and values widened (chunk x (D + Dv)).
  static Index scratch_size(Index lane_count, Index head_dim, Index value_dim) {
    return decode_chunk * lane_count + (widens ? decode_chunk * (head_dim + value_dim) : 0);
  }

  /// Lays out the rows' queries in q, within the capacity of its buffers.
  static void prepare(const AttentionParams<T, KV>& p, const DecodeRows<T>& rows, Queries& q) {
    q.lanes = lanes(rows.rows());
    q.depth = p.head_dim();
    q.alibi = p.mask.has_alibi();
    q.scale = p.scale;
    const auto size = static_cast<std::size_t>(q.lanes);
    q.qt.assign(static_cast<std::size_t>(q.depth) * size, T(0));
    q.key_begin.assign(size, T(0));
    q.key_end.assign(size, static_cast<T>(p.k_len()));
    q.slope.assign(size, T(0));
    q.diagonal.assign(size, T(0));
    for (Index r = 0; r < rows.rows(); ++r) {
      const T* query = row_pointer(p.q, rows.batch, rows.head(r), rows.query_row(r));
      for (Index d = 0; d < q.depth; ++d) q.qt[static_cast<std::size_t>(d * q.lanes + r)] = query[d];
      const RowMask<T>& mask = rows.masks[static_cast<std::size_t>(r)];
      const auto lane = static_cast<std::size_t>(r);
      q.key_begin[lane] = static_cast<T>(mask.keys.begin);
      q.key_end[lane] = static_cast<T>(mask.keys.end);
      q.slope[lane] = mask.slope;
      q.diagonal[lane] = mask.diagonal;
    }
  }

  /// One chunk: the lanes in groups of up to micro_packets packets.
  static void chunk(const Queries& q, const DecodeRows<T>&, const AttentionParams<T, KV>&, const DecodeChunk<KV>& chunk,
                    Index value_dim, T* scratch, const DecodePartial<T>& part) {
    constexpr Index ps = micro::packet_size<T>;
    const Index packets = q.lanes / ps, n = chunk.hi - chunk.lo;
    const KV* keys = chunk.k + chunk.lo * chunk.ldk;
    const KV* values = chunk.v + chunk.lo * chunk.ldv;
    micro::ChunkRows<T> rows;
    if constexpr (widens) {  // after the scores in scratch
      T* k_wide = scratch + decode_chunk * q.lanes;
      T* v_wide = k_wide + n * q.depth;
      micro::widen_rows(keys, chunk.ldk, n, q.depth, k_wide);
      micro::widen_rows(values, chunk.ldv, n, value_dim, v_wide);
      rows = {k_wide, q.depth, v_wide, value_dim};
    } else {
      rows = {keys, chunk.ldk, values, chunk.ldv};
    }
    for (Index v0 = 0; v0 < packets; v0 += micro::micro_packets) {
      switch (std::min<Index>(micro::micro_packets, packets - v0)) {
        case 1: micro::grouped_lanes<T, 1, KV>(q, v0, chunk, rows, value_dim, scratch, part); break;
        case 2: micro::grouped_lanes<T, 2, KV>(q, v0, chunk, rows, value_dim, scratch, part); break;
        case 3: micro::grouped_lanes<T, 3, KV>(q, v0, chunk, rows, value_dim, scratch, part); break;
        default: micro::grouped_lanes<T, 4, KV>(q, v0, chunk, rows, value_dim, scratch, part); break;
      }
    }
  }
};

}  // namespace selfattn::detail
