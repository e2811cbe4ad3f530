// selfattn/detail/decode.hpp — the decode kernel: attention for few query rows over many keys (incremental
// decoding), split over chunks of keys (flash-decoding).
//
// Decoding reads the whole KV cache to produce a handful of output rows: the work is memory-bound, and threads
// must split the keys, not the few queries. So the keys of each (batch, key/value head) are cut into chunks of
// decode_chunk; one of three paths computes an unnormalised partial (max, sum, acc) for every query row of the
// group over one chunk; the partials are merged in chunk order (merge_partial) and finished (finish_row), both
// softmax.hpp's rules. The merge order is fixed, so the result does not depend on the thread count.
//
// The paths (one per file) and the one rule that picks among them, decode_path:
//   general    decode_general.hpp    any mask, bias, ALiBi or dropout; Eigen products per chunk
//   grouped    decode_grouped.hpp    no per-element mask and no dropout; the R = G Lq rows in SIMD lanes
//   streaming  decode_streaming.hpp  the same conditions and R <= 3: vectorised over D, bound by memory
// Which kernel (reference, fused, decode) a public call runs is attention.hpp's choice (decode_suits).
#pragma once

#include <selfattn/detail/checked_size.hpp>
#include <selfattn/detail/kernels.hpp>
#include <selfattn/detail/decode_general.hpp>
#include <selfattn/detail/decode_grouped.hpp>
#include <selfattn/detail/decode_rows.hpp>
#include <selfattn/detail/decode_streaming.hpp>
#include <selfattn/detail/params.hpp>
#include <selfattn/detail/simd.hpp>
#include <selfattn/detail/softmax.hpp>
#include <selfattn/detail/threads.hpp>
#include <selfattn/tensor.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <string>
#include <tuple>
#include <vector>

namespace selfattn::detail {

/// Query rows per head up to which the automatic kernel choice runs the decode kernel (attention.hpp): a step
/// of up to 16 new tokens, or a short draft of speculative decoding. Beyond, the fused kernel's blocks of 64
/// query rows are no longer mostly empty.
constexpr Index decode_max_query_rows = 16;

/// The one predicate of the automatic kernel choice for decoding: few query rows per head (Lq <= 16). Any
/// mask, bias or dropout is fine (the general path takes them); weights are not (only the reference has them).
template <typename T, typename KV>
bool decode_suits(const AttentionParams<T, KV>& p) {
  return p.q_len() <= decode_max_query_rows;
}

/// The path of the decode kernel that computes a call.
enum class DecodePath {
  general,   ///< any mask, bias, ALiBi or dropout
  grouped,   ///< no per-element mask, no dropout: rows of a key/value head's group in SIMD lanes
  streaming  ///< the grouped path's conditions and at most streaming_max_rows rows per key/value head
};

/// Query rows per key/value head up to which the streaming path runs: R = G Lq <= 3 uses at most 3 of the
/// grouped kernel's 16 float lanes, and the step is bound by memory.
constexpr Index streaming_max_rows = 3;

/// The rule that picks the path: general with per-element masks or dropout, else streaming for R <= 3 rows per
/// key/value head, else grouped.
template <typename T, typename KV>
DecodePath decode_path(const AttentionParams<T, KV>& p) {
  if (p.mask.has_element_masks() || p.dropout.active()) return DecodePath::general;
  return p.group() * p.q_len() <= streaming_max_rows ? DecodePath::streaming : DecodePath::grouped;
}

/// Folds partial `next` into `merged` (softmax.hpp's rule 5), vectorised as the partials are laid out: lane-major
/// ones a packet of rows at a time, the values of a packet of rows per column; row-major ones row
/// by row, the values of a row a packet at a time under its broadcast weights. `lanes` is the rows' count rounded
/// as the path lays them out (a whole number of packets when lane-major; padding rows merge as empty rows).
template <typename T>
void merge_partials(bool lane_major, const DecodePartial<T>& merged, const DecodePartial<T>& next, Index rows,
                    Index lanes, Index value_dim) {
  using namespace Eigen::internal;
  using P = micro::Packet<T>;
  constexpr Index ps = micro::packet_size<T>;
  if (lane_major) {
    for (Index r = 0; r < lanes; r += ps) {
      P max = ploadu<P>(merged.max + r), sum = ploadu<P>(merged.sum + r);
      const micro::MergeWeights<T> weights =
          micro::merge_partial<T>(max, sum, ploadu<P>(next.max + r), ploadu<P>(next.sum + r));
      pstoreu(merged.max + r, max);
      pstoreu(merged.sum + r, sum);
      for (Index e = 0; e < value_dim; ++e) {
        T* value = &merged.value(r, e);
        pstoreu(value, weights.value(ploadu<P>(value), ploadu<P>(&next.value(r, e))));
      }
    }
    return;
  }
  for (Index r = 0; r < rows; ++r) {
    const MergeWeights<T> weights = merge_partial(merged.max[r], merged.sum[r], next.max[r], next.sum[r]);
    const micro::MergeWeights<T> broadcast{pset1<P>(weights.a), pset1<P>(weights.b)};
    T* value = &merged.value(r, 0);
    const T* other = &next.value(r, 0);
    Index e = 0;
    for (; e + ps <= value_dim; e += ps) pstoreu(value + e, broadcast.value(ploadu<P>(value + e), ploadu<P>(other + e)));
    for (; e < value_dim; ++e) value[e] = weights.value(value[e], other[e]);
  }
}

/// The decode kernel's scratch, kept between calls (AttentionWorkspace): the rows of every (batch, key/value
/// head), their queries as each path lays them out, the partials and each thread's scores. Containers only grow
/// (a call uses their first entries and re-assigns its buffers within their capacity), so a call of the same
/// shape as an earlier one, or with fewer keys, allocates nothing.
template <typename T>
struct DecodeScratch {
  std::vector<DecodeRows<T>> row_sets;
  std::tuple<std::vector<typename GeneralDecode<T>::Queries>, std::vector<typename GroupedDecode<T>::Queries>,
             std::vector<typename StreamingDecode<T>::Queries>>
      queries;
  micro::Buffer<T> partials;
  std::vector<micro::Buffer<T>> threads;

  template <typename Path>
  std::vector<typename Path::Queries>& queries_of() {
    return std::get<std::vector<typename Path::Queries>>(queries);
  }

  /// Room for the partials of calls over up to `keys` keys with `heads` (batch, key/value head) pairs of `rows`
  /// query rows each and values of `value_dim`: what a loop whose key count grows (a KV cache) reserves once.
  /// Throws std::length_error naming the arguments when the partials would exceed detail::max_elements(sizeof(T)),
  /// before anything is allocated; the counts are >= 0.
  void reserve(Index heads, Index rows, Index keys, Index value_dim) {
    const Index limit = max_elements(sizeof(T)), packet = micro::packet_size<T>;
    const auto message = [&] {
      return size_limit_message("AttentionWorkspace::reserve_decode", "pairs, rows, keys, value_dim",
                                "the element count of the decode partials of (" + std::to_string(heads) + ", " +
                                    std::to_string(rows) + ", " + std::to_string(keys) + ", " +
                                    std::to_string(value_dim) + ")",
                                limit, "elements");
    };
    // Rounded up without the wrap of ceil_div's a + b - 1 near Index's maximum.
    const Index lanes = checked_mul(rows / packet + (rows % packet != 0), packet, limit, message);
    const Index chunks = std::max<Index>(1, keys / decode_chunk + (keys % decode_chunk != 0));
    const Index values = checked_add(value_dim, 2, limit, message);
    const Index count = checked_product(std::array<Index, 4>{heads, chunks, lanes, values}, limit, message);
    partials.reserve(static_cast<std::size_t>(count));
  }
};

/// The driver shared by the paths: tasks (batch, key/value head, chunk) write partials, merged afterwards in
/// chunk order and finished into out and lse. `Path` is GeneralDecode, GroupedDecode or StreamingDecode (of the
/// storage type KV of keys and values).
template <typename Path, typename T, typename KV>
void run_decode(const AttentionParams<T, KV>& p, const ForwardOutputs<T>& result, DecodeScratch<T>& scratch_space) {
  const Index kv_heads = p.kv_heads(), heads = p.batch() * kv_heads, rows = p.group() * p.q_len();
  const Index value_dim = p.value_dim(), lanes = Path::lanes(rows);
  const Index chunks = std::max<Index>(1, ceil_div(p.k_len(), decode_chunk)), tasks = heads * chunks;
  if (heads == 0 || rows == 0) return;

  // The rows of every (batch, key/value head) with their masks, and their queries as the path lays them out.
  std::vector<DecodeRows<T>>& row_sets = scratch_space.row_sets;
  std::vector<typename Path::Queries>& queries = scratch_space.template queries_of<Path>();
  grow_to(row_sets, heads);
  grow_to(queries, heads);
  for (Index head = 0; head < heads; ++head) {
    const auto at = static_cast<std::size_t>(head);
    decode_rows(p, head / kv_heads, head % kv_heads, row_sets[at]);
    Path::prepare(p, row_sets[at], queries[at]);
  }

  // One partial per task: max (lanes), sum (lanes), acc (lanes x Dv, lane- or row-major as the path writes it).
  const Index partial_size = lanes * (value_dim + 2);
  micro::Buffer<T>& partials = scratch_space.partials;
  partials.assign(static_cast<std::size_t>(tasks * partial_size), T(0));
  const auto partial = [&](Index task) {
    T* base = partials.data() + task * partial_size;
    return Path::lane_major ? DecodePartial<T>{base, base + lanes, base + 2 * lanes, 1, lanes}
                            : DecodePartial<T>{base, base + lanes, base + 2 * lanes, value_dim, 1};
  };
  const double work = static_cast<double>(heads * rows) * static_cast<double>(p.k_len()) *
                      static_cast<double>(p.head_dim() + value_dim);
  const int threads = threads_for(work, tasks);
  std::vector<micro::Buffer<T>>& scratch = scratch_space.threads;  // sized before any thread starts
  grow_to(scratch, threads);
  for (int t = 0; t < threads; ++t)
    scratch[static_cast<std::size_t>(t)].assign(
        static_cast<std::size_t>(Path::scratch_size(lanes, p.head_dim(), value_dim)), T(0));
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
#endif
  for (Index task = 0; task < tasks; ++task) {
    const Index head = task / chunks, c = task % chunks, b = head / kv_heads, hk = head % kv_heads;
    const DecodeRows<T>& set = row_sets[static_cast<std::size_t>(head)];
    const Index begin = c * decode_chunk, end = std::min(p.k_len(), begin + decode_chunk);
    // Only keys some row may see are read at all; the chunk is masked unless every row sees all of them.
    const Index lo = std::max(begin, set.first_key), hi = std::min(end, set.last_key);
    if (lo >= hi) {
      empty_partial(partial(task), lanes, value_dim);
      continue;
    }
    const DecodeChunk<KV> chunk{row_pointer(p.k, b, hk, 0), p.k.stride(2), row_pointer(p.v, b, hk, 0), p.v.stride(2),
                               lo, hi, std::min(hi + decode_chunk, set.last_key), !set.all_see(lo, hi)};
    Path::chunk(queries[static_cast<std::size_t>(head)], set, p, chunk, value_dim,
                scratch[static_cast<std::size_t>(thread_id())].data(), partial(task));
  }

  // Merge each head's chunks in chunk order (merge_partials), then finish: o_r = acc_r / l_r (times dropout's
  // 1 / (1 - p)). Heads are independent: threads share them, each head merged by one thread in chunk order.
  const T keep_scale = p.dropout.active() ? p.dropout.keep_scale() : T(1);
  [[maybe_unused]] const int merge_threads = static_cast<int>(std::min<Index>(threads, heads));
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(merge_threads) if (merge_threads > 1)
#endif
  for (Index head = 0; head < heads; ++head) {
    const DecodeRows<T>& set = row_sets[static_cast<std::size_t>(head)];
    const DecodePartial<T> merged = partial(head * chunks);
    for (Index c = 1; c < chunks; ++c)
      merge_partials(Path::lane_major, merged, partial(head * chunks + c), rows, lanes, value_dim);
    for (Index r = 0; r < rows; ++r) {
      const FinishedRow<T> finished = finish_row(merged.max[r], merged.sum[r], keep_scale);
      T* out = row_pointer(result.out, set.batch, set.head(r), set.query_row(r));
      for (Index e = 0; e < value_dim; ++e) out[e] = finished.output(merged.value(r, e));
      element(result.lse, set.batch, set.head(r), set.query_row(r)) = finished.lse;
    }
  }
}

/// The decode kernel: the same contract as reference_forward without weights. `path` defaults to the rule's
/// choice; tests and benchmarks force each path. A fast path asked for where per-element masks or dropout rule
/// it out runs the general path instead: forcing a path never changes what is computed. Keys and values may be
/// stored in 16 bits (KV = bfloat16 or float16, T = float): every path reads them in place and widens them exactly.
template <typename T, typename KV>
void decode_forward(const AttentionParams<T, KV>& p, const ForwardOutputs<T>& result, DecodePath path,
                    DecodeScratch<T>& scratch) {
  if (decode_path(p) == DecodePath::general) path = DecodePath::general;
  switch (path) {
    case DecodePath::general: run_decode<GeneralDecode<T, KV>>(p, result, scratch); break;
    case DecodePath::grouped: run_decode<GroupedDecode<T, KV>>(p, result, scratch); break;
    case DecodePath::streaming: run_decode<StreamingDecode<T, KV>>(p, result, scratch); break;
  }
}

/// decode_forward with scratch of its own, allocated for this call.
template <typename T, typename KV>
void decode_forward(const AttentionParams<T, KV>& p, const ForwardOutputs<T>& result, DecodePath path) {
  DecodeScratch<T> scratch;
  decode_forward(p, result, path, scratch);
}

template <typename T, typename KV>
void decode_forward(const AttentionParams<T, KV>& p, const ForwardOutputs<T>& result, DecodeScratch<T>& scratch) {
  decode_forward(p, result, decode_path(p), scratch);
}

template <typename T, typename KV>
void decode_forward(const AttentionParams<T, KV>& p, const ForwardOutputs<T>& result) {
  decode_forward(p, result, decode_path(p));
}

}  // namespace selfattn::detail
