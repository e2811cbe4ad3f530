// selfattn/detail/decode.hpp — attention for few queries over many keys (incremental decoding), and the
// merge of partial results over disjoint key sets.
//
// Decoding reads the whole KV cache to produce a handful of output rows: the work is memory-bound. The
// keys are cut into chunks; each chunk yields a partial result (out_c, lse_c) for every query row of a
// key/value head's group, and the partials are merged by their log-sum-exps (flash-decoding). Chunks are
// independent, so threads split the keys rather than the few queries. The merge runs in chunk order, so
// the result does not depend on the thread count.
#pragma once

#include <selfattn/detail/decode_microkernels.hpp>
#include <selfattn/detail/reference.hpp>
#include <selfattn/tensor.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace selfattn::detail {

/// Merges partial attention over disjoint key sets, one row at a time:
///   lse = log(exp(lse_a) + exp(lse_b)),   out = exp(lse_a - lse) out_a + exp(lse_b - lse) out_b.
/// A partial with lse = -inf saw no key and contributes nothing; two such give out 0 and lse -inf.
template <typename T, typename RowA, typename RowB, typename RowOut>
T merge_partial_rows(T lse_a, const RowA& out_a, T lse_b, const RowB& out_b, RowOut&& out) {
  constexpr T minus_infinity = -std::numeric_limits<T>::infinity();
  const T m = std::max(lse_a, lse_b);
  if (m == minus_infinity) {
    out.setZero();
    return minus_infinity;
  }
  // Weights relative to the larger lse: one of them is exactly 1, neither overflows.
  const T weight_a = lse_a == minus_infinity ? T(0) : std::exp(lse_a - m);
  const T weight_b = lse_b == minus_infinity ? T(0) : std::exp(lse_b - m);
  const T sum = weight_a + weight_b;
  if (weight_b == T(0))
    out = out_a;
  else if (weight_a == T(0))
    out = out_b;
  else
    out = (weight_a / sum) * out_a + (weight_b / sum) * out_b;
  return m + std::log(sum);
}

/// Keys per chunk: 256 rows of K and V (D = 128, float: 256 KB together) keep a chunk's scores and
/// probabilities in L1 while the rows stream once from memory; enough chunks for 2 threads from 512 keys.
constexpr Index decode_chunk = 256;

/// Partial attention of the query rows of one key/value head over keys [begin, end): rows r = g * Lq + l
/// (g = query head within the group, l = query row). Writes out (rows, Dv), normalised, and lse per row.
template <typename T>
void decode_chunk_partial(const AttentionParams<T>& p, Index b, Index kv_head, const RowMajorMatrix<T>& queries,
                          Index begin, Index end, RowMajorMatrix<T>& out, Eigen::Matrix<T, Eigen::Dynamic, 1>& lse) {
  constexpr T minus_infinity = -std::numeric_limits<T>::infinity();
  const Index group = p.heads() / p.k.dim(1), rows = queries.rows(), keys = end - begin;
  const auto k = as_matrix(p.k[b][kv_head]).middleRows(begin, keys);
  const auto v = as_matrix(p.v[b][kv_head]).middleRows(begin, keys);
  // s = scale * q . k_j for every row and key of the chunk: one small GEMM streaming the chunk's keys.
  RowMajorMatrix<T> s(rows, keys);
  s.noalias() = p.scale * (queries * k.transpose());
  // Decoding's common case: no per-element mask or score term, and the chunk inside every row's key
  // range. Then there is nothing to do per element but the exponential.
  bool all_visible = !p.mask.allowed.present() && !p.mask.has_score_offset();
  for (Index i = 0; all_visible && i < p.q_len(); ++i) {
    const KeyRange range = p.mask.key_range(b, i);
    all_visible = range.begin <= begin && end <= range.end;
  }
  if (!all_visible)
    for (Index r = 0; r < rows; ++r) {
      const Index h = kv_head * group + r / p.q_len(), i = r % p.q_len();
      const KeyRange range = p.mask.key_range(b, i);
      for (Index j = begin; j < end; ++j) {
        const bool visible = j >= range.begin && j < range.end && p.mask.element_allowed(b, h, i, j);
        // Select the masked value (never compute it): NaN in a masked key must not survive.
        s(r, j - begin) = visible ? s(r, j - begin) + (p.mask.has_score_offset() ? p.mask.score_offset(b, h, i, j) : T(0))
                                  : minus_infinity;
      }
    }
  for (Index r = 0; r < rows; ++r) {  // softmax within the chunk: P = exp(s - m) / l, lse = m + log l
    T m = minus_infinity;
    for (Index c = 0; c < keys; ++c)
      if (!(s(r, c) <= m) && !std::isnan(m)) m = s(r, c);  // a NaN score, once seen, stays
    if (m == minus_infinity) {
      s.row(r).setZero();
      lse(r) = minus_infinity;
      continue;
    }
    // Vectorised exp; masked entries are selected to 0 (Eigen's vectorised exp(-inf) is not 0).
    auto row = s.row(r).array();
    if (all_visible)
      row = (row - m).exp();
    else
      row = (row == minus_infinity).select(T(0), (row - m).exp());
    const T l = row.sum();
    lse(r) = m + std::log(l);
    row /= l;
    if (p.dropout.active()) {  // after the sum: lse is before dropout, o uses the dropped weights
      const Index h = kv_head * group + r / p.q_len(), i = r % p.q_len();
      for (Index c = 0; c < keys; ++c) s(r, c) = dropped_weight(p, b, h, i, begin + c, s(r, c));
    }
  }
  if (all_visible && !p.dropout.active()) {
    out.noalias() = s * v;  // o = P V
  } else {
    out.setZero();
    for (Index r = 0; r < rows; ++r)
      for (Index c = 0; c < keys; ++c)
        if (s(r, c) != T(0)) out.row(r) += s(r, c) * v.row(c);  // masked keys skipped, not weighted by 0
  }
}

/// The general decode path: any mask, bias or dropout; each chunk's products through Eigen.
template <typename T>
void general_decode_forward(const AttentionParams<T>& p, const ForwardOutputs<T>& result) {
  const Index kv_heads = p.k.dim(1), group = p.heads() / kv_heads, rows = group * p.q_len();
  const Index chunks = std::max<Index>(1, (p.k_len() + decode_chunk - 1) / decode_chunk);
  const Index value_dim = p.value_dim();
  for (Index b = 0; b < p.batch(); ++b) {
    // Partials of every (kv head, chunk), merged afterwards in chunk order.
    std::vector<RowMajorMatrix<T>> outs(static_cast<std::size_t>(kv_heads * chunks), RowMajorMatrix<T>(rows, value_dim));
    std::vector<Eigen::Matrix<T, Eigen::Dynamic, 1>> lses(static_cast<std::size_t>(kv_heads * chunks),
                                                          Eigen::Matrix<T, Eigen::Dynamic, 1>(rows));
    std::vector<RowMajorMatrix<T>> queries(static_cast<std::size_t>(kv_heads), RowMajorMatrix<T>(rows, p.q.dim(3)));
    for (Index hk = 0; hk < kv_heads; ++hk)
      for (Index g = 0; g < group; ++g)
        queries[static_cast<std::size_t>(hk)].middleRows(g * p.q_len(), p.q_len()) = as_matrix(p.q[b][hk * group + g]);
#ifdef _OPENMP
#pragma omp parallel for schedule(static)
#endif
    for (Index task = 0; task < kv_heads * chunks; ++task) {
      const Index hk = task / chunks, c = task % chunks;
      const Index begin = c * decode_chunk, end = std::min(p.k_len(), begin + decode_chunk);
      decode_chunk_partial(p, b, hk, queries[static_cast<std::size_t>(hk)], begin, end,
                           outs[static_cast<std::size_t>(task)], lses[static_cast<std::size_t>(task)]);
    }
    for (Index hk = 0; hk < kv_heads; ++hk) {
      RowMajorMatrix<T>& merged = outs[static_cast<std::size_t>(hk * chunks)];
      Eigen::Matrix<T, Eigen::Dynamic, 1>& merged_lse = lses[static_cast<std::size_t>(hk * chunks)];
      for (Index c = 1; c < chunks; ++c) {
        const auto& out_c = outs[static_cast<std::size_t>(hk * chunks + c)];
        const auto& lse_c = lses[static_cast<std::size_t>(hk * chunks + c)];
        for (Index r = 0; r < rows; ++r) {
          const Eigen::Matrix<T, 1, Eigen::Dynamic> previous = merged.row(r);
          merged_lse(r) = merge_partial_rows(merged_lse(r), previous, lse_c(r), out_c.row(r), merged.row(r));
        }
      }
      for (Index r = 0; r < rows; ++r) {
        const Index h = hk * group + r / p.q_len(), i = r % p.q_len();
        result.lse(b, h, i) = merged_lse(r);
        as_vector(result.out[b][h][i]) = merged.row(r);
      }
    }
  }
}

/// Keys per chunk of the grouped path: a chunk's scores, 256 keys x 16 float lanes (16 KB), stay in L1 while
/// its keys and values stream through once, and the next chunk's 256 KB of K and V fit in L2 beside the
/// current one while they are prefetched; 32k keys give 128 chunks per key/value head to share among threads.
/// (128 and 512 measured within noise of 256.)
constexpr Index grouped_decode_chunk = 256;

/// Whether the grouped path computes this call: no per-element mask, no bias, no dropout (ALiBi and every
/// structural mask are fine).
template <typename T>
bool grouped_decode_applies(const AttentionParams<T>& p) {
  return !p.mask.allowed.present() && !p.mask.bias.present() && !p.dropout.active();
}

/// The grouped path (decode_microkernels.hpp): the R = (H / Hkv) Lq rows of a key/value head in SIMD lanes,
/// K and V read in place once per chunk. Tasks are (batch, key/value head, chunk); each writes an unnormalised
/// partial, and the partials of a head are merged in chunk order afterwards, so the result does not depend on
/// the thread count.
template <typename T>
void grouped_decode_forward(const AttentionParams<T>& p, const ForwardOutputs<T>& result) {
  constexpr T minus_infinity = -std::numeric_limits<T>::infinity();
  constexpr Index ps = micro::packet_size<T>;
  const Index kv_heads = p.k.dim(1), group = p.heads() / kv_heads, rows = group * p.q_len();
  const Index lanes = (rows + ps - 1) / ps * ps, depth = p.q.dim(3), value_dim = p.value_dim();
  const Index chunks = std::max<Index>(1, (p.k_len() + grouped_decode_chunk - 1) / grouped_decode_chunk);
  const Index heads = p.batch() * kv_heads, tasks = heads * chunks;

  // The query rows of every (batch, key/value head), row r = g * Lq + i in lane r (query head kv_head * G + g).
  std::vector<micro::GroupedQueries<T>> queries(static_cast<std::size_t>(heads));
  for (Index b = 0; b < p.batch(); ++b)
    for (Index hk = 0; hk < kv_heads; ++hk) {
      micro::GroupedQueries<T>& q = queries[static_cast<std::size_t>(b * kv_heads + hk)];
      q.rows = rows;
      q.lanes = lanes;
      q.depth = depth;
      q.alibi = p.mask.alibi_slopes != nullptr;
      q.qt.assign(static_cast<std::size_t>(depth * lanes), T(0));
      q.key_begin.assign(static_cast<std::size_t>(lanes), T(0));
      q.key_end.assign(static_cast<std::size_t>(lanes), static_cast<T>(p.k_len()));
      q.slope.assign(static_cast<std::size_t>(lanes), T(0));
      q.diagonal.assign(static_cast<std::size_t>(lanes), T(0));
      q.first_key = p.k_len();
      q.last_key = 0;
      q.common_begin = 0;
      q.common_end = p.k_len();
      for (Index r = 0; r < rows; ++r) {
        const Index h = hk * group + r / p.q_len(), i = r % p.q_len();
        const auto lane = static_cast<std::size_t>(r);
        for (Index d = 0; d < depth; ++d) q.qt[static_cast<std::size_t>(d * lanes + r)] = p.scale * p.q(b, h, i, d);
        const KeyRange range = p.mask.key_range(b, i);
        q.key_begin[lane] = static_cast<T>(range.begin);
        q.key_end[lane] = static_cast<T>(range.end);
        if (q.alibi) {
          q.slope[lane] = p.mask.alibi_slopes[h];
          q.diagonal[lane] = static_cast<T>(i + p.mask.offset());
        }
        q.first_key = std::min(q.first_key, range.begin);
        q.last_key = std::max(q.last_key, range.end);
        q.common_begin = std::max(q.common_begin, range.begin);
        q.common_end = std::min(q.common_end, range.end);
      }
    }

  // One partial per task: out (Dv, lanes), then max and sum (lanes each).
  const Index partial_size = (value_dim + 2) * lanes;
  micro::Buffer<T> partials(static_cast<std::size_t>(tasks * partial_size));
  auto partial = [&](Index task) {
    T* base = partials.data() + task * partial_size;
    return micro::GroupedPartial<T>{base, base + value_dim * lanes, base + (value_dim + 1) * lanes};
  };
#ifdef _OPENMP
#pragma omp parallel
#endif
  {
    micro::Buffer<T> scores(static_cast<std::size_t>(grouped_decode_chunk * lanes));  // per thread
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
    for (Index task = 0; task < tasks; ++task) {
      const Index head = task / chunks, c = task % chunks, b = head / kv_heads, hk = head % kv_heads;
      const TensorView<const T, 2> k = p.k[b][hk], v = p.v[b][hk];
      const Index begin = c * grouped_decode_chunk, end = std::min(p.k_len(), begin + grouped_decode_chunk);
      micro::grouped_chunk(queries[static_cast<std::size_t>(head)], k.data(), k.stride(0), v.data(), v.stride(0),
                           value_dim, begin, end, scores.data(), partial(task));
    }
  }

  for (Index head = 0; head < heads; ++head) {
    const Index b = head / kv_heads, hk = head % kv_heads;
    const micro::GroupedPartial<T> merged = partial(head * chunks);
    for (Index c = 1; c < chunks; ++c) micro::grouped_merge(lanes, value_dim, merged, partial(head * chunks + c));
    for (Index r = 0; r < rows; ++r) {  // o_r = out_r / sum_r, lse_r = max_r + log sum_r; no key: 0 and -inf
      const Index h = hk * group + r / p.q_len(), i = r % p.q_len();
      const T sum = merged.sum[r];
      result.lse(b, h, i) = sum == T(0) ? minus_infinity : merged.max[r] + std::log(sum);
      for (Index e = 0; e < value_dim; ++e)
        result.out(b, h, i, e) = sum == T(0) ? T(0) : merged.out[e * lanes + r] / sum;
    }
  }
}

/// Keys per chunk of the streaming path: a chunk's K and V rows (D = 128, float: 128 KB each) and the next
/// chunk's, prefetched while this one is computed, fit in L2 together; 32k keys give 128 chunks per key/value
/// head to share among threads.
constexpr Index streaming_decode_chunk = 256;

/// Query rows per key/value head up to which decode_forward's automatic choice takes the streaming path:
/// R = G Lq <= 3 uses at most 3 of the grouped kernel's 16 float lanes, and the step is bound by memory.
constexpr Index streaming_decode_max_rows = 3;

/// The streaming path (decode_microkernels.hpp, micro::streaming_chunk): each query row vectorised over D, K and
/// V streamed once per chunk with the next chunk prefetched. Same conditions as the grouped path
/// (grouped_decode_applies). Tasks are (batch, key/value head, chunk); each writes a normalised partial
/// (out, lse), and the partials of a head are merged with merge_partial_rows in chunk order, so the result does
/// not depend on the thread count.
template <typename T>
void streaming_decode_forward(const AttentionParams<T>& p, const ForwardOutputs<T>& result) {
  const Index kv_heads = p.k.dim(1), group = p.heads() / kv_heads, rows = group * p.q_len();
  const Index depth = p.q.dim(3), value_dim = p.value_dim();
  const Index chunks = std::max<Index>(1, (p.k_len() + streaming_decode_chunk - 1) / streaming_decode_chunk);
  const Index heads = p.batch() * kv_heads, tasks = heads * chunks;

  std::vector<micro::StreamingQueries<T>> queries(static_cast<std::size_t>(heads));
  for (Index b = 0; b < p.batch(); ++b)
    for (Index hk = 0; hk < kv_heads; ++hk) {
      micro::StreamingQueries<T>& q = queries[static_cast<std::size_t>(b * kv_heads + hk)];
      q.rows = rows;
      q.depth = depth;
      q.alibi = p.mask.alibi_slopes != nullptr;
      q.q.assign(static_cast<std::size_t>(rows * depth), T(0));
      q.key_begin.assign(static_cast<std::size_t>(rows), 0);
      q.key_end.assign(static_cast<std::size_t>(rows), p.k_len());
      q.slope.assign(static_cast<std::size_t>(rows), T(0));
      q.diagonal.assign(static_cast<std::size_t>(rows), T(0));
      q.first_key = p.k_len();
      q.last_key = 0;
      q.common_begin = 0;
      q.common_end = p.k_len();
      for (Index r = 0; r < rows; ++r) {
        const Index h = hk * group + r / p.q_len(), i = r % p.q_len();
        const auto row = static_cast<std::size_t>(r);
        for (Index d = 0; d < depth; ++d) q.q[static_cast<std::size_t>(r * depth + d)] = p.scale * p.q(b, h, i, d);
        const KeyRange range = p.mask.key_range(b, i);
        q.key_begin[row] = range.begin;
        q.key_end[row] = range.end;
        if (q.alibi) {
          q.slope[row] = p.mask.alibi_slopes[h];
          q.diagonal[row] = static_cast<T>(i + p.mask.offset());
        }
        q.first_key = std::min(q.first_key, range.begin);
        q.last_key = std::max(q.last_key, range.end);
        q.common_begin = std::max(q.common_begin, range.begin);
        q.common_end = std::min(q.common_end, range.end);
      }
    }

  // One partial per task: out (R, Dv) normalised, then lse (R).
  const Index partial_size = rows * (value_dim + 1);
  micro::Buffer<T> partials(static_cast<std::size_t>(tasks * partial_size));
#ifdef _OPENMP
#pragma omp parallel
#endif
  {
    micro::Buffer<T> scores(static_cast<std::size_t>(micro::streaming_rows * streaming_decode_chunk));  // per thread
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
    for (Index task = 0; task < tasks; ++task) {
      const Index head = task / chunks, c = task % chunks, b = head / kv_heads, hk = head % kv_heads;
      const TensorView<const T, 2> k = p.k[b][hk], v = p.v[b][hk];
      const Index begin = c * streaming_decode_chunk, end = std::min(p.k_len(), begin + streaming_decode_chunk);
      T* base = partials.data() + task * partial_size;
      micro::streaming_chunk(queries[static_cast<std::size_t>(head)], k.data(), k.stride(0), v.data(), v.stride(0),
                             value_dim, begin, end, scores.data(), base, base + rows * value_dim);
    }
  }

  using RowMap = Eigen::Map<Eigen::Matrix<T, 1, Eigen::Dynamic>>;
  Eigen::Matrix<T, 1, Eigen::Dynamic> previous(value_dim);
  for (Index head = 0; head < heads; ++head) {
    const Index b = head / kv_heads, hk = head % kv_heads;
    T* merged = partials.data() + head * chunks * partial_size;
    T* merged_lse = merged + rows * value_dim;
    for (Index c = 1; c < chunks; ++c) {
      T* part = merged + c * partial_size;
      for (Index r = 0; r < rows; ++r) {
        previous = RowMap(merged + r * value_dim, value_dim);
        merged_lse[r] = merge_partial_rows(merged_lse[r], previous, part[rows * value_dim + r],
                                           RowMap(part + r * value_dim, value_dim),
                                           RowMap(merged + r * value_dim, value_dim));
      }
    }
    for (Index r = 0; r < rows; ++r) {
      const Index h = hk * group + r / p.q_len(), i = r % p.q_len();
      result.lse(b, h, i) = merged_lse[r];
      as_vector(result.out[b][h][i]) = RowMap(merged + r * value_dim, value_dim);
    }
  }
}

/// Which decode path decode_forward runs, when the fast paths apply (grouped_decode_applies: no per-element
/// mask, bias or dropout; otherwise always general). automatic: streaming when a key/value head serves at most
/// streaming_decode_max_rows query rows (memory-bound), else grouped (the rows fill SIMD lanes). general, grouped,
/// streaming: that path (tests force each for every group size).
enum class DecodeKernel { automatic, general, grouped, streaming };

/// The decode forward: same contract as reference_forward (no weights), split over key chunks.
template <typename T>
void decode_forward(const AttentionParams<T>& p, const ForwardOutputs<T>& result,
                    DecodeKernel kernel = DecodeKernel::automatic) {
  const Index rows = p.heads() / p.k.dim(1) * p.q_len();
  if (kernel == DecodeKernel::general || !grouped_decode_applies(p))
    general_decode_forward(p, result);
  else if (kernel == DecodeKernel::streaming ||
           (kernel == DecodeKernel::automatic && rows <= streaming_decode_max_rows))
    streaming_decode_forward(p, result);
  else
    grouped_decode_forward(p, result);
}

}  // namespace selfattn::detail
