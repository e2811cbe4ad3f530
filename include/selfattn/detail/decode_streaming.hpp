// selfattn/detail/decode_streaming.hpp — the streaming decode path: one to a few query rows per key/value head
// (G = H / Hkv small, Lq = 1). Then each key and value row serves R <= 3 rows, 1 to 3 flops per byte: the step is
// bound by memory, and the grouped kernel's lanes would be mostly idle (R of 16). This kernel vectorises over D
// instead, with the R rows' queries in L1:
//
//   pass 1   s_rj = (scale q_r) . k_j     packets over d, 4 keys at a time (4 R accumulators), then one
//                                         horizontal sum per (row, key); ALiBi and key ranges per score
//   pass 2   p_rj = exp(s_rj - m_r)       softmax_row (softmax.hpp): packets over the chunk's keys, masked scores
//                                         selected to exactly 0; l_r = sum_j p_rj, m_r the row maximum
//   pass 3   acc_r = sum_j p_rj v_j       packets over e (up to 8 per row in registers), a broadcast p_rj per key
//
// Each chunk's result is an unnormalised partial (m, l, acc); decode.hpp merges the chunks and divides by l.
//
// K and V are each read once per chunk, in address order, and software prefetches (into L2) keep one pass ahead:
// pass 1 requests the chunk's values while it reads the keys, pass 3 the next chunk's keys while it reads the
// values. The hardware prefetchers alone restart on each new 128 KB stream; measured on Zen 4 (32k keys,
// H = Hkv = 8, one thread) 12.7 GB/s with them alone or with the next chunk's K and V prefetched during their
// own passes (the grouped kernel's scheme), 16.8 GB/s with this one.
// Rows beyond 4 are done in blocks of 4 over the same chunk, which is then in L2.

#pragma once

#include <selfattn/detail/decode_rows.hpp>
#include <selfattn/detail/mask.hpp>
#include <selfattn/detail/params.hpp>
#include <selfattn/detail/simd.hpp>
#include <selfattn/detail/softmax.hpp>
#include <selfattn/detail/kernels.hpp>
#include <selfattn/tensor.hpp>

#include <Eigen/Core>

#include <algorithm>
#include <limits>
#include <type_traits>

namespace selfattn::detail {
namespace micro {

/// Rows per block of the streaming kernel (the score pass holds 4 keys x rows accumulators).
inline constexpr int streaming_rows = 4;

/// Value packets per row kept in registers in pass 3: up to 8 (D = 128 floats under AVX-512 in one sweep), and
/// no more than the register file takes beside the operands (24 accumulators with 32 registers, 12 with 16).
template <int R>
inline constexpr int streaming_value_packets =
    std::max(1, std::min(8, (EIGEN_ARCH_DEFAULT_NUMBER_OF_REGISTERS >= 32 ? 24 : 12) / R));

/// The query rows of one (batch, key/value head) for the streaming kernel, row r = g * Lq + i; their masks are
/// the DecodeRows the driver passes beside them.
template <typename T>
struct StreamingQueries {
  Index depth = 0;     ///< D
  Buffer<T> q;         ///< (R, D): q[r * D + d] = scale * q_r[d]
  bool alibi = false;  ///< whether s_ij -= slope * |diagonal - j|
};

/// Rows [r0, r0 + R) of the streaming kernel over the keys [lo, hi) of a chunk (n = hi - lo). scores: scratch of
/// R x n. Writes rows r0.. of the partial (max, sum, acc (rows, Dv)). prefetch: whether to prefetch this chunk's
/// values (during pass 1) and the keys [hi, next_end) of the next chunk (during pass 3). Keys and values of a 16-bit
/// KV are widened to T as they are loaded: half the bytes from memory, the same float arithmetic.
template <typename T, int R, typename KV>
void streaming_block(const StreamingQueries<T>& q, const DecodeRows<T>& rows, Index r0, const DecodeChunk<KV>& chunk,
                     Index value_dim, bool prefetch, T* scores, const DecodePartial<T>& part) {
  using namespace Eigen::internal;
  using P = Packet<T>;
  constexpr Index ps = packet_size<T>;
  constexpr T minus_infinity = -std::numeric_limits<T>::infinity();
  const KV* k = chunk.k;
  const KV* v = chunk.v;
  const Index ldk = chunk.ldk, ldv = chunk.ldv, lo = chunk.lo, hi = chunk.hi;
  const Index n = hi - lo, depth = q.depth, full_depth = depth / ps * ps;
  const Index key_bytes = depth * static_cast<Index>(sizeof(KV));
  const Index value_bytes = value_dim * static_cast<Index>(sizeof(KV));
  const T* queries = q.q.data() + r0 * depth;

  // Pass 1: scores, 4 keys at a time; the chunk's values (pass 3's data) prefetched as the keys are read.
  for_each_tile<4>(n, [&](auto tile, Index j0) SELFATTN_INLINE_LAMBDA {
    constexpr int M = decltype(tile)::value;
    unroll<M>([&](auto m) {
      if (prefetch) prefetch_row(v + (lo + j0 + m) * ldv, value_bytes);
    });
    P acc[M][R];
    unroll<M>([&](auto m) { unroll<R>([&](auto r) { acc[m][r] = pset1<P>(T(0)); }); });
    const KV* key = k + (lo + j0) * ldk;
    for (Index d = 0; d < full_depth; d += ps) {
      P keys[M];
      unroll<M>([&](auto m) { keys[m] = load_widened<T>(key + m * ldk + d); });
      unroll<R>([&](auto r) {
        const P query = ploadu<P>(queries + r * depth + d);
        unroll<M>([&](auto m) { acc[m][r] = pmadd(keys[m], query, acc[m][r]); });
      });
    }
    unroll<M>([&](auto m) {
      const Index j = lo + j0 + m;
      unroll<R>([&](auto r) {
        T s = predux(acc[m][r]);
        for (Index d = full_depth; d < depth; ++d) s += widen<T>(key[m * ldk + d]) * queries[r * depth + d];
        const RowMask<T>& mask = rows.masks[static_cast<std::size_t>(r0 + r)];
        if (q.alibi) s = minus_alibi(s, mask.slope, mask.diagonal, static_cast<T>(j));
        // Select, never use, a masked score: a NaN key outside the range must not survive.
        if (chunk.masked && !mask.keys.contains(j)) s = minus_infinity;
        scores[r * n + j0 + m] = s;
      });
    });
  });

  // Pass 2: p = exp(s - m) per row, exactly 0 where s = -inf (softmax.hpp's rules); the partial's max and sum.
  unroll<R>([&](auto r) { part.max[r0 + r] = softmax_row(scores + r * n, n, part.sum + r0 + r); });

  // Pass 3: acc_r = sum_j p_rj v_j over tiles of value packets, all keys of the chunk per tile; the next chunk's
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
        if (prefetching && hi + j < chunk.next_end) prefetch_row(k + (hi + j) * ldk, key_bytes);
        const KV* value = v + (lo + j) * ldv + e0;
        P vv[NV];
        unroll<NV>([&](auto w) { vv[w] = load_widened<T>(value + w * ps); });
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
        unroll<NV>([&](auto w) { pstoreu(part.acc + (r0 + r) * value_dim + e0 + w * ps, acc[r][w]); });
      });
    });
    // The last value_dim % ps columns, scalar (value_dim below one packet: all of them).
    unroll<R>([&](auto r) {
      for (Index e = full_values; e < value_dim; ++e) {
        T acc = T(0);
        for (Index j = 0; j < n; ++j) {
          const T probability = scores[r * n + j];
          if (!decltype(safe)::value || probability != T(0)) acc += probability * widen<T>(v[(lo + j) * ldv + e]);
        }
        part.acc[(r0 + r) * value_dim + e] = acc;
      }
    });
  };
  with_flag(chunk.masked, values);
}

}  // namespace micro

/// The streaming path as decode.hpp's driver runs it: each row vectorised over D, K and V streamed once per chunk
/// with the next chunk prefetched. Partials are row-major: acc (R, Dv). KV: the storage type of keys and values.
template <typename T, typename KV = T>
struct StreamingDecode {
  using Queries = micro::StreamingQueries<T>;

  static Index lanes(Index rows) { return rows; }
  static constexpr bool lane_major = false;
  static Index scratch_size(Index, Index, Index) { return micro::streaming_rows * decode_chunk; }

  /// Lays out the rows' queries in q, within the capacity of its buffer.
  static void prepare(const AttentionParams<T, KV>& p, const DecodeRows<T>& rows, Queries& q) {
    q.depth = p.head_dim();
    q.alibi = p.mask.has_alibi();
    q.q.assign(static_cast<std::size_t>(rows.rows() * q.depth), T(0));
    for (Index r = 0; r < rows.rows(); ++r) {
      const T* query = row_pointer(p.q, rows.batch, rows.head(r), rows.query_row(r));
      for (Index d = 0; d < q.depth; ++d) q.q[static_cast<std::size_t>(r * q.depth + d)] = p.scale * query[d];
    }
  }

  /// One chunk: the rows in blocks of streaming_rows over the same keys (then in L2); only the first block
  /// prefetches, later blocks find the chunk in L2 and the next one already requested.
  static void chunk(const Queries& q, const DecodeRows<T>& rows, const AttentionParams<T, KV>&, const DecodeChunk<KV>& chunk,
                    Index value_dim, T* scratch, const DecodePartial<T>& part) {
    for (Index r0 = 0; r0 < rows.rows(); r0 += micro::streaming_rows) {
      const bool prefetch = r0 == 0;
      switch (std::min<Index>(micro::streaming_rows, rows.rows() - r0)) {
        case 1: micro::streaming_block<T, 1, KV>(q, rows, r0, chunk, value_dim, prefetch, scratch, part); break;
        case 2: micro::streaming_block<T, 2, KV>(q, rows, r0, chunk, value_dim, prefetch, scratch, part); break;
        case 3: micro::streaming_block<T, 3, KV>(q, rows, r0, chunk, value_dim, prefetch, scratch, part); break;
        default: micro::streaming_block<T, 4, KV>(q, rows, r0, chunk, value_dim, prefetch, scratch, part); break;
      }
    }
  }
};

}  // namespace selfattn::detail
