// selfattn/detail/decode_microkernels.hpp — the grouped decode kernel: every query row that shares a key/value
// head, against one chunk of that head's keys, without copying the keys or values anywhere.
//
// Grouped-query decoding has G = H / Hkv query heads (times the Lq rows of the step) per key/value head. Each key
// and value row serves all R = G * Lq of them, so the step does 4 R D flops per key row of 2 D elements: for
// R = 16 that is 8 flops per byte, and the kernel is bound by arithmetic, not by memory. Eigen's GEMM spends
// most of its time on such small products packing the operands; this kernel packs nothing but the queries
// (once per call) and puts the R query rows in the SIMD lanes ("rows in lanes"):
//
//   q^T   (D, Rp)     qt[d * Rp + r] = scale * q_r[d]; rows padded with zeros to Rp, a multiple of the packet
//   S^T   (n, Rp)     S^T[j] = sum_d k_j[d] * q^T[d]: one FMA per (key, d) and packet, the key element broadcast
//                     straight from the cache (K is read once, in place, row by row)
//   P^T   (n, Rp)     exp(S^T[j] - m) in the same buffer, m the per-lane (= per-row) maximum over the chunk
//   O^T   (Dv, Rp)    O^T[e] = sum_j v_j[e] * P^T[j]: one FMA per (key, e) and packet, the value element broadcast
//                     straight from the cache (V read once, in place)
//
// Both products are micro::micro_kernel (microkernels.hpp) with a different operand as "A": the cache rows
// give the broadcast scalars, the lane-major queries or probabilities give the packets. The softmax, the
// masks and the merge of chunks are per lane, hence vertical packet operations with no shuffles. A chunk's
// scores stay in L1 (256 keys x 16 float lanes: 16 KB).
#pragma once

#include <selfattn/detail/microkernels.hpp>
#include <selfattn/tensor.hpp>

#include <Eigen/Core>

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

namespace selfattn::detail::micro {

/// Register tile of the grouped kernel: keys (pass 1) or value columns (pass 3) per tile when the rows take NV
/// packets, MR x NV = 4 accumulators. Small on purpose: every row of the tile is a separate stream of
/// broadcasts, and wider tiles measured slower, from memory (AMD Zen 4, 32k keys, G = 16, float: 84 GFLOP/s
/// at 4 keys, 66 at 8, 41 at 24) and from cache (105, 101, 90 GFLOP/s).
template <int NV>
inline constexpr int grouped_tile = std::max(1, 4 / NV);

/// Steps of a micro-kernel's depth loop per prefetched cache line (LinePrefetcher): one line per 4 steps of
/// 4 FMAs is about 14 GB/s at this core's FMA rate, the rate the kernel consumes K and V at.
inline constexpr int grouped_prefetch_period = 4;

/// f(std::integral_constant<int, N>{}, start) over [0, count): tiles of Full, then of 8, 4, 2 and 1, so a
/// ragged end costs a few small tiles and not one instantiation per size.
template <int Full, typename F>
EIGEN_ALWAYS_INLINE void for_each_tile(Index count, F&& f) {
  Index start = 0;
  for (; start + Full <= count; start += Full) f(std::integral_constant<int, Full>{}, start);
  auto smaller = [&](auto size) SELFATTN_INLINE_LAMBDA {
    if constexpr (decltype(size)::value < Full)
      for (; start + decltype(size)::value <= count; start += decltype(size)::value) f(size, start);
  };
  smaller(std::integral_constant<int, 8>{});
  smaller(std::integral_constant<int, 4>{});
  smaller(std::integral_constant<int, 2>{});
  smaller(std::integral_constant<int, 1>{});
}

/// Prefetches the cache lines of rows [first, end) of a matrix (rows ld elements apart, `width` elements each)
/// into L2, in address order, one line per touch(): spread evenly over a compute loop, the memory traffic for
/// the data a later loop needs overlaps the arithmetic instead of stalling it.
template <typename T>
class LinePrefetcher {
 public:
  LinePrefetcher() = default;  ///< prefetches nothing
  LinePrefetcher(const T* base, Index ld, Index width, Index first, Index end)
      : row_(reinterpret_cast<const char*>(base + first * ld)),
        row_bytes_(width * static_cast<Index>(sizeof(T))),
        ld_bytes_(ld * static_cast<Index>(sizeof(T))),
        rows_(std::max<Index>(0, end - first)) {}

  EIGEN_ALWAYS_INLINE void touch() {
    if (rows_ == 0) return;
#if defined(__GNUC__) || defined(__clang__)
    __builtin_prefetch(row_ + offset_, 0, 2);  // prefetcht1: into L2, not L1 (the scores and queries live there)
#else
    Eigen::internal::prefetch(row_ + offset_);
#endif
    offset_ += line;
    if (offset_ >= row_bytes_) {
      offset_ = 0;
      row_ += ld_bytes_;
      --rows_;
    }
  }

 private:
  static constexpr Index line = 64;
  const char* row_ = nullptr;
  Index row_bytes_ = 0, ld_bytes_ = 0, rows_ = 0, offset_ = 0;
};

/// micro::micro_kernel (microkernels.hpp, same arithmetic, bitwise the same result) with one
/// prefetcher.touch() every grouped_prefetch_period steps of the depth loop.
template <typename T, int MR, int NV, bool Safe>
EIGEN_ALWAYS_INLINE void prefetching_kernel(Index depth, const T* a, Index ams, Index aks, const T* b, Index ldb,
                                            Packet<T> (&result)[MR][NV], LinePrefetcher<T>& prefetcher) {
  using P = Packet<T>;
  constexpr Index ps = packet_size<T>;
  const P zero = Eigen::internal::pset1<P>(T(0));
  P acc[MR][NV];
  unroll<MR>([&](auto m) { unroll<NV>([&](auto v) { acc[m][v] = zero; }); });
  for (Index k = 0; k < depth; ++k) {
    if (k % grouped_prefetch_period == 0) prefetcher.touch();
    const T* b_row = b + k * ldb;
    const T* a_col = a + k * aks;
    P bv[NV];
    unroll<NV>([&](auto v) { bv[v] = Eigen::internal::ploadu<P>(b_row + v * ps); });
    unroll<MR>([&](auto m) {
      const P av = Eigen::internal::pset1<P>(a_col[m * ams]);
      unroll<NV>([&](auto v) {
        if constexpr (Safe) {
          const P skip = Eigen::internal::por(Eigen::internal::pcmp_eq(av, zero), Eigen::internal::pcmp_eq(bv[v], zero));
          acc[m][v] = Eigen::internal::pselect(skip, acc[m][v], Eigen::internal::pmadd(av, bv[v], acc[m][v]));
        } else {
          acc[m][v] = Eigen::internal::pmadd(av, bv[v], acc[m][v]);
        }
      });
    });
  }
  unroll<MR>([&](auto m) { unroll<NV>([&](auto v) { result[m][v] = acc[m][v]; }); });
}

/// The query rows of one (batch, key/value head) laid out for the grouped kernel, one row per lane.
/// Filled by the caller (decode.hpp); lanes >= rows are padding: q = 0, visible everywhere, no ALiBi.
template <typename T>
struct GroupedQueries {
  Index rows = 0;            ///< R = G * Lq real rows
  Index lanes = 0;           ///< Rp: R rounded up to whole packets
  Index depth = 0;           ///< D
  Buffer<T> qt;              ///< (D, Rp): qt[d * Rp + r] = scale * q_r[d]
  Buffer<T> key_begin;       ///< (Rp): first key the row may see (its structural key range), as T
  Buffer<T> key_end;         ///< (Rp): one past its last key
  Buffer<T> slope;           ///< (Rp): ALiBi slope of the row's head, when alibi
  Buffer<T> diagonal;        ///< (Rp): i + Lk - Lq of the row, when alibi
  bool alibi = false;        ///< whether s_ij -= slope * |diagonal - j|
  Index first_key = 0;       ///< min over real rows of key_begin
  Index last_key = 0;        ///< max over real rows of key_end
  Index common_begin = 0;    ///< max over real rows of key_begin: keys in [common_begin, common_end) are
  Index common_end = 0;      ///< visible to every row
};

/// Unnormalised partial attention of a chunk, per lane: out (Dv, Rp) = sum_j exp(s_j - max) v_j^T,
/// sum (Rp) = sum_j exp(s_j - max), max (Rp), the chunk's row maximum (-inf for a row that saw no key).
template <typename T>
struct GroupedPartial {
  T* out;
  T* max;
  T* sum;
};

/// Lanes [v0, v0 + NV packets) of the grouped kernel over keys [lo, hi) (all within the chunk).
/// masked: some row does not see every key of [lo, hi) (check key ranges, skip zero probabilities).
template <typename T, int NV>
void grouped_lanes(const GroupedQueries<T>& q, Index v0, const T* k, Index ldk, const T* v, Index ldv,
                   Index value_dim, Index lo, Index hi, bool masked, T* scores, const GroupedPartial<T>& part) {
  using namespace Eigen::internal;
  using P = Packet<T>;
  constexpr Index ps = packet_size<T>;
  constexpr int MR = grouped_tile<NV>;
  const Index lanes = q.lanes, n = hi - lo;
  const P minus_infinity = pset1<P>(-std::numeric_limits<T>::infinity());
  const T* qt = q.qt.data() + v0 * ps;
  T* st = scores + v0 * ps;

  // The hardware prefetchers do not keep up with a few rows read in parallel (nor with V read by columns,
  // below): measured on Zen 4, G = 16, 32k keys, one thread, 50 GFLOP/s with K and V from memory against 105
  // from cache. So the first lane group prefetches the next chunk (the next task of this thread under a static
  // schedule) line by line while it computes: its keys during pass 1, its values during pass 3 (84 GFLOP/s).
  LinePrefetcher<T> next_keys, next_values;
  if (v0 == 0) {
    next_keys = LinePrefetcher<T>(k, ldk, q.depth, hi, std::min(hi + n, q.last_key));
    next_values = LinePrefetcher<T>(v, ldv, value_dim, hi, std::min(hi + n, q.last_key));
  }

  // Pass 1. s_rj = scale q_r . k_j (+ ALiBi, -inf where masked) for the keys of the chunk, and the row maxima.
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
    // A(m, d) = k_{lo + j0 + m}[d] read in place (row stride ldk); B(d, lanes) = q^T.
    prefetching_kernel<T, M, NV, false>(q.depth, k + (lo + j0) * ldk, ldk, 1, qt, lanes, acc, next_keys);
    unroll<M>([&](auto m) {
      const P key = pset1<P>(static_cast<T>(lo + j0 + m));
      unroll<NV>([&](auto w) {
        P s = acc[m][w];
        // ALiBi: s - slope |i + off - j|, the distance exact in T (an integer below 2^24 in float).
        if (q.alibi) s = psub(s, pmul(slope[w], pabs(psub(diagonal[w], key))));
        // Select, never compute, a masked score: a NaN key outside the range must not survive.
        if (masked) s = pselect(pand(pcmp_le(begin[w], key), pcmp_lt(key, end[w])), s, minus_infinity);
        row_max[w] = pmax(row_max[w], s);
        pstoreu(st + (j0 + m) * lanes + w * ps, s);
      });
    });
  });

  // Pass 2. p_rj = exp(s_rj - m_r), exactly 0 where s_rj = -inf; a row without any key uses m = 0 (no -inf - -inf).
  P row_sum[NV], shift[NV];
  unroll<NV>([&](auto w) {
    shift[w] = pselect(pcmp_eq(row_max[w], minus_infinity), pset1<P>(T(0)), row_max[w]);
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
      prefetching_kernel<T, M, NV, decltype(safe)::value>(n, v + lo * ldv + e0, 1, ldv, st, lanes, acc, next_values);
      unroll<M>([&](auto m) {
        unroll<NV>([&](auto w) { pstoreu(part.out + (e0 + m) * lanes + (v0 + w) * ps, acc[m][w]); });
      });
    });
  };
  if (masked)
    values(std::true_type{});
  else
    values(std::false_type{});
}

/// The grouped kernel for one (batch, key/value head) over keys [begin, end): k (Lk, D) and v (Lk, Dv) rows
/// ldk and ldv elements apart, scores a scratch of (end - begin) x Rp. Writes the chunk's GroupedPartial.
template <typename T>
void grouped_chunk(const GroupedQueries<T>& q, const T* k, Index ldk, const T* v, Index ldv, Index value_dim,
                   Index begin, Index end, T* scores, const GroupedPartial<T>& part) {
  constexpr Index ps = packet_size<T>;
  // Only keys some row may see are read at all; the chunk is masked unless every row sees all of them.
  const Index lo = std::max(begin, q.first_key), hi = std::min(end, q.last_key);
  if (lo >= hi) {
    std::fill(part.out, part.out + value_dim * q.lanes, T(0));
    std::fill(part.max, part.max + q.lanes, -std::numeric_limits<T>::infinity());
    std::fill(part.sum, part.sum + q.lanes, T(0));
    return;
  }
  const bool masked = lo < q.common_begin || hi > q.common_end;
  const Index packets = q.lanes / ps;
  for (Index v0 = 0; v0 < packets; v0 += micro_packets) {  // lanes in groups of up to 4 packets
    switch (std::min<Index>(micro_packets, packets - v0)) {
      case 1: grouped_lanes<T, 1>(q, v0, k, ldk, v, ldv, value_dim, lo, hi, masked, scores, part); break;
      case 2: grouped_lanes<T, 2>(q, v0, k, ldk, v, ldv, value_dim, lo, hi, masked, scores, part); break;
      case 3: grouped_lanes<T, 3>(q, v0, k, ldk, v, ldv, value_dim, lo, hi, masked, scores, part); break;
      default: grouped_lanes<T, 4>(q, v0, k, ldk, v, ldv, value_dim, lo, hi, masked, scores, part); break;
    }
  }
}

/// Folds partial b into the running partial a, per lane (flash-decoding's merge, unnormalised):
///   m = max(m_a, m_b),  w_a = exp(m_a - m),  w_b = exp(m_b - m),  out = w_a out_a + w_b out_b,  sum likewise.
/// A partial with max -inf saw no key: its weight is exactly 0 (selected); two such stay 0 with max -inf.
template <typename T>
void grouped_merge(Index lanes, Index value_dim, const GroupedPartial<T>& a, const GroupedPartial<T>& b) {
  using namespace Eigen::internal;
  using P = Packet<T>;
  constexpr Index ps = packet_size<T>;
  const P minus_infinity = pset1<P>(-std::numeric_limits<T>::infinity());
  for (Index l = 0; l < lanes; l += ps) {
    const P max_a = ploadu<P>(a.max + l), max_b = ploadu<P>(b.max + l), max = pmax(max_a, max_b);
    const P shift = pselect(pcmp_eq(max, minus_infinity), pset1<P>(T(0)), max);
    const P weight_a = exp_or_zero<T>(max_a, shift), weight_b = exp_or_zero<T>(max_b, shift);
    pstoreu(a.max + l, max);
    pstoreu(a.sum + l, pmadd(weight_a, ploadu<P>(a.sum + l), pmul(weight_b, ploadu<P>(b.sum + l))));
    for (Index e = 0; e < value_dim; ++e) {
      T* out = a.out + e * lanes + l;
      pstoreu(out, pmadd(weight_a, ploadu<P>(out), pmul(weight_b, ploadu<P>(b.out + e * lanes + l))));
    }
  }
}


// ---------------------------------------------------------------------------------------------------------------
// The streaming kernel: one to a few query rows per key/value head (G = H / Hkv small, Lq = 1). Then each key
// and value row serves R <= 3 rows, 1 to 3 flops per byte: the step is bound by memory, and the grouped kernel's
// lanes would be mostly idle (R of 16). This kernel vectorises over D instead, with the R rows' queries in L1:
//
//   pass 1   s_rj = (scale q_r) . k_j     packets over d, 4 keys at a time (4 R accumulators), then one
//                                         horizontal sum per (row, key); ALiBi and key ranges per score
//   pass 2   p_rj = exp(s_rj - m_r)       packets over the chunk's keys (exp_or_zero: masked scores are -inf,
//                                         selected to exactly 0), l_r = sum_j p_rj, m_r the row maximum
//   pass 3   o_r = sum_j p_rj v_j / l_r   packets over e (up to 8 per row in registers), a broadcast p_rj per key
//
// K and V are each read once per chunk, in address order, and software prefetches (into L2) keep one pass ahead:
// pass 1 requests the chunk's values while it reads the keys, pass 3 the next chunk's keys while it reads the
// values. The hardware prefetchers alone restart on each new 128 KB stream; measured on Zen 4 (32k keys,
// H = Hkv = 8, one thread) 12.7 GB/s with them alone or with the next chunk's K and V prefetched during their
// own passes (the grouped kernel's scheme), 16.8 GB/s with this one.
// Rows beyond 4 are done in blocks of 4 over the same chunk, which is then in L2.

/// Rows per block of the streaming kernel (the score pass holds 4 keys x rows accumulators).
inline constexpr int streaming_rows = 4;

/// Value packets per row kept in registers in pass 3: up to 8 (D = 128 floats under AVX-512 in one sweep), and
/// no more than the register file takes beside the operands (24 accumulators with 32 registers, 12 with 16).
template <int R>
inline constexpr int streaming_value_packets =
    std::max(1, std::min(8, (EIGEN_ARCH_DEFAULT_NUMBER_OF_REGISTERS >= 32 ? 24 : 12) / R));

/// Prefetches the lines of one row of `bytes` bytes into L2 (prefetcht1, as LinePrefetcher).
EIGEN_ALWAYS_INLINE void prefetch_row(const void* row, Index bytes) {
  const char* line = static_cast<const char*>(row);
  for (Index offset = 0; offset < bytes; offset += 64) {
#if defined(__GNUC__) || defined(__clang__)
    __builtin_prefetch(line + offset, 0, 2);
#else
    Eigen::internal::prefetch(line + offset);
#endif
  }
}

/// The query rows of one (batch, key/value head) for the streaming kernel, row r = g * Lq + i.
/// Filled by the caller (decode.hpp).
template <typename T>
struct StreamingQueries {
  Index rows = 0;            ///< R = G * Lq
  Index depth = 0;           ///< D
  Buffer<T> q;               ///< (R, D): q[r * D + d] = scale * q_r[d]
  std::vector<Index> key_begin;  ///< (R): first key the row may see
  std::vector<Index> key_end;    ///< (R): one past its last key
  Buffer<T> slope;           ///< (R): ALiBi slope of the row's head, when alibi
  Buffer<T> diagonal;        ///< (R): i + Lk - Lq of the row, when alibi
  bool alibi = false;        ///< whether s_ij -= slope * |diagonal - j|
  Index first_key = 0;       ///< min over rows of key_begin
  Index last_key = 0;        ///< max over rows of key_end
  Index common_begin = 0;    ///< keys in [common_begin, common_end) are visible to every row
  Index common_end = 0;
};

/// Rows [r0, r0 + R) of the streaming kernel over keys [lo, hi) (n = hi - lo <= the chunk). scores: scratch of
/// R x n. Writes out rows r0.. of (rows, Dv) normalised, and lse. prefetch: whether to prefetch this chunk's values
/// (during pass 1) and the keys of rows [hi, prefetch_end) of the next chunk (during pass 3).
template <typename T, int R>
void streaming_block(const StreamingQueries<T>& q, Index r0, const T* k, Index ldk, const T* v, Index ldv,
                     Index value_dim, Index lo, Index hi, bool masked, bool prefetch, Index prefetch_end, T* scores,
                     T* out, T* lse) {
  using namespace Eigen::internal;
  using P = Packet<T>;
  constexpr Index ps = packet_size<T>;
  constexpr T minus_infinity = -std::numeric_limits<T>::infinity();
  const Index n = hi - lo, depth = q.depth, full_depth = depth / ps * ps;
  const Index key_bytes = depth * static_cast<Index>(sizeof(T));
  const Index value_bytes = value_dim * static_cast<Index>(sizeof(T));
  const T* queries = q.q.data() + r0 * depth;

  // Pass 1: scores, 4 keys at a time; the chunk's values (pass 3's data) prefetched as the keys are read.
  for_each_tile<4>(n, [&](auto tile, Index j0) SELFATTN_INLINE_LAMBDA {
    constexpr int M = decltype(tile)::value;
    unroll<M>([&](auto m) {
      if (prefetch) prefetch_row(v + (lo + j0 + m) * ldv, value_bytes);
    });
    P acc[M][R];
    unroll<M>([&](auto m) { unroll<R>([&](auto r) { acc[m][r] = pset1<P>(T(0)); }); });
    const T* key = k + (lo + j0) * ldk;
    for (Index d = 0; d < full_depth; d += ps) {
      P keys[M];
      unroll<M>([&](auto m) { keys[m] = ploadu<P>(key + m * ldk + d); });
      unroll<R>([&](auto r) {
        const P query = ploadu<P>(queries + r * depth + d);
        unroll<M>([&](auto m) { acc[m][r] = pmadd(keys[m], query, acc[m][r]); });
      });
    }
    unroll<M>([&](auto m) {
      const Index j = lo + j0 + m;
      unroll<R>([&](auto r) {
        T s = predux(acc[m][r]);
        for (Index d = full_depth; d < depth; ++d) s += key[m * ldk + d] * queries[r * depth + d];
        const auto row = static_cast<std::size_t>(r0 + r);
        // ALiBi: s - slope |i + off - j|, the distance exact in T.
        if (q.alibi) s -= q.slope[row] * std::abs(q.diagonal[row] - static_cast<T>(j));
        // Select, never use, a masked score: a NaN key outside the range must not survive.
        if (masked && !(q.key_begin[row] <= j && j < q.key_end[row])) s = minus_infinity;
        scores[r * n + j0 + m] = s;
      });
    });
  });

  // Pass 2: p = exp(s - m) per row, exactly 0 where s = -inf; a row without any key uses m = 0.
  T sum[R];
  unroll<R>([&](auto r) {
    T* s = scores + r * n;
    T max = minus_infinity;
    for (Index j = 0; j < n; ++j) max = std::max(max, s[j]);
    const T shift = max == minus_infinity ? T(0) : max;
    const P shift_packet = pset1<P>(shift);
    P sum_packet = pset1<P>(T(0));
    Index j = 0;
    for (; j + ps <= n; j += ps) {
      const P probability = exp_or_zero<T>(ploadu<P>(s + j), shift_packet);
      sum_packet = padd(sum_packet, probability);
      pstoreu(s + j, probability);
    }
    T total = predux(sum_packet);
    for (; j < n; ++j) {
      s[j] = s[j] == minus_infinity ? T(0) : std::exp(s[j] - shift);
      total += s[j];
    }
    sum[r] = total;
    // A NaN score (a NaN in a visible key) makes max NaN or the sum NaN: lse and out NaN, as in the reference.
    lse[r0 + r] = total == T(0) ? minus_infinity : max + std::log(total);
  });

  // Pass 3: o_r = sum_j p_rj v_j over tiles of value packets, all keys of the chunk per tile; the next chunk's
  // keys (the next pass 1's data) prefetched during the first tile. With masks a zero probability's product is
  // skipped, not added as 0 * v (a NaN value there must not reach the output).
  constexpr int NB = streaming_value_packets<R>;
  const P zero = pset1<P>(T(0));
  const Index full_values = value_dim / ps * ps;
  auto values = [&](auto safe) SELFATTN_INLINE_LAMBDA {
    for_each_tile<NB>(full_values / ps, [&](auto tile, Index b0) SELFATTN_INLINE_LAMBDA {
      constexpr int NV = decltype(tile)::value;
      const Index e0 = b0 * ps;
      P acc[R][NV];
      unroll<R>([&](auto r) { unroll<NV>([&](auto w) { acc[r][w] = pset1<P>(T(0)); }); });
      const bool prefetching = prefetch && e0 == 0;
      for (Index j = 0; j < n; ++j) {
        if (prefetching && hi + j < prefetch_end) prefetch_row(k + (hi + j) * ldk, key_bytes);
        const T* value = v + (lo + j) * ldv + e0;
        P vv[NV];
        unroll<NV>([&](auto w) { vv[w] = ploadu<P>(value + w * ps); });
        unroll<R>([&](auto r) {
          const P probability = pset1<P>(scores[r * n + j]);
          unroll<NV>([&](auto w) {
            if constexpr (decltype(safe)::value)
              acc[r][w] = pselect(pcmp_eq(probability, zero), acc[r][w], pmadd(probability, vv[w], acc[r][w]));
            else
              acc[r][w] = pmadd(probability, vv[w], acc[r][w]);
          });
        });
      }
      unroll<R>([&](auto r) {
        const P inverse = pset1<P>(sum[r] == T(0) ? T(0) : T(1) / sum[r]);
        unroll<NV>([&](auto w) { pstoreu(out + (r0 + r) * value_dim + e0 + w * ps, pmul(acc[r][w], inverse)); });
      });
    });
    // The last value_dim % ps columns, scalar (value_dim below one packet: all of them).
    unroll<R>([&](auto r) {
      const T inverse = sum[r] == T(0) ? T(0) : T(1) / sum[r];
      for (Index e = full_values; e < value_dim; ++e) {
        T acc = T(0);
        for (Index j = 0; j < n; ++j) {
          const T probability = scores[r * n + j];
          if (!decltype(safe)::value || probability != T(0)) acc += probability * v[(lo + j) * ldv + e];
        }
        out[(r0 + r) * value_dim + e] = acc * inverse;
      }
    });
  };
  if (masked)
    values(std::true_type{});
  else
    values(std::false_type{});
}

/// The streaming kernel for one (batch, key/value head) over keys [begin, end): k (Lk, D) and v (Lk, Dv) rows
/// ldk and ldv elements apart; scores a scratch of streaming_rows x (end - begin). Writes out (R, Dv), each row
/// normalised over the chunk's keys, and lse (R) (0 and -inf for a row that sees none of them). Prefetches the
/// chunk's values and the keys of [end, end + (end - begin)) some row may see: the next chunk of a static schedule.
template <typename T>
void streaming_chunk(const StreamingQueries<T>& q, const T* k, Index ldk, const T* v, Index ldv, Index value_dim,
                     Index begin, Index end, T* scores, T* out, T* lse) {
  // Only keys some row may see are read at all; the chunk is masked unless every row sees all of them.
  const Index lo = std::max(begin, q.first_key), hi = std::min(end, q.last_key);
  if (lo >= hi) {
    std::fill(out, out + q.rows * value_dim, T(0));
    std::fill(lse, lse + q.rows, -std::numeric_limits<T>::infinity());
    return;
  }
  const bool masked = lo < q.common_begin || hi > q.common_end;
  const Index prefetch_end = std::min(hi + (end - begin), q.last_key);
  for (Index r0 = 0; r0 < q.rows; r0 += streaming_rows) {
    // Only the first block prefetches: later blocks find the chunk in L2 and the next one already requested.
    const bool prefetch = r0 == 0;
    switch (std::min<Index>(streaming_rows, q.rows - r0)) {
      case 1:
        streaming_block<T, 1>(q, r0, k, ldk, v, ldv, value_dim, lo, hi, masked, prefetch, prefetch_end, scores, out,
                              lse);
        break;
      case 2:
        streaming_block<T, 2>(q, r0, k, ldk, v, ldv, value_dim, lo, hi, masked, prefetch, prefetch_end, scores, out,
                              lse);
        break;
      case 3:
        streaming_block<T, 3>(q, r0, k, ldk, v, ldv, value_dim, lo, hi, masked, prefetch, prefetch_end, scores, out,
                              lse);
        break;
      default:
        streaming_block<T, 4>(q, r0, k, ldk, v, ldv, value_dim, lo, hi, masked, prefetch, prefetch_end, scores, out,
                              lse);
        break;
    }
  }
}

}  // namespace selfattn::detail::micro
