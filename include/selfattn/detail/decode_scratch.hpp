// selfattn/detail/decode_scratch.hpp — the memory the decode kernel keeps between calls (AttentionWorkspace): the
// rows of every (batch, key/value head), their queries as each path lays them out, the partials and each thread's
// scores. The queries' layouts are plain data shared by every instruction-set level (kernels.hpp); the paths that
// fill and read them are kernels/decode_grouped.inc and kernels/decode_streaming.inc, compiled once per level.
#pragma once

#include <selfattn/detail/checked_size.hpp>
#include <selfattn/detail/decode_rows.hpp>
#include <selfattn/detail/simd.hpp>
#include <selfattn/tensor.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

namespace selfattn::detail {
namespace micro {

/// The query rows of one (batch, key/value head) for the grouped path, rows in SIMD lanes.
template <typename T>
struct GroupedQueries {
  Index lanes = 0;           ///< Rp: R rounded up to whole packets of the level that runs
  Index depth = 0;           ///< D
  Buffer<T> qt;              ///< (D, Rp): qt[d * Rp + r] = q_r[d]
  T scale = T(1);            ///< s = scale * q . k, applied to the finished dot product
  T softcap = T(0);          ///< > 0: s = softcap * tanh(s / softcap), before ALiBi and the masks
  Buffer<T> key_begin;       ///< (Rp): first key the row may see (its structural key range), as T
  Buffer<T> key_end;         ///< (Rp): one past its last key
  Buffer<T> slope;           ///< (Rp): ALiBi slope of the row's head, when alibi
  Buffer<T> diagonal;        ///< (Rp): i + Lk - Lq of the row, when alibi
  bool alibi = false;        ///< whether s_ij -= slope * |diagonal - j|
};

/// The query rows of one (batch, key/value head) for the streaming path, row r = g * Lq + i; their masks are
/// the DecodeRows the driver passes beside them.
template <typename T>
struct StreamingQueries {
  Index depth = 0;     ///< D
  Buffer<T> q;         ///< (R, D): q[r * D + d] = scale * q_r[d]
  bool alibi = false;  ///< whether s_ij -= slope * |diagonal - j|
};

}  // namespace micro

/// The decode kernel's scratch, kept between calls (AttentionWorkspace). Containers only grow (a call uses their
/// first entries and re-assigns its buffers within their capacity), so a call of the same shape as an earlier one,
/// or with fewer keys, allocates nothing.
template <typename T>
struct DecodeScratch {
  std::vector<DecodeRows<T>> row_sets;
  std::tuple<std::vector<RowMajorMatrix<T>>, std::vector<micro::GroupedQueries<T>>,
             std::vector<micro::StreamingQueries<T>>>
      queries;
  micro::Buffer<T> partials;
  std::vector<micro::Buffer<T>> threads;
  std::vector<Index> task_first;  ///< per task: its first key
  std::vector<Index> task_last;   ///< per task: one past its last key (task_first: an empty head's one empty task)
  std::vector<Index> task_head;   ///< per task: its (batch, key/value head)
  std::vector<Index> task_begin;  ///< per head: its first task; then the task count
  std::vector<std::int32_t> paged_table;  ///< a paged call's page tables, B rows (paged_attention.hpp)
  std::vector<Index> paged_lengths;       ///< a paged call's sequence lengths

  /// The queries of a path (GeneralDecode, GroupedDecode or StreamingDecode of any level).
  template <typename Path>
  std::vector<typename Path::Queries>& queries_of() {
    return std::get<std::vector<typename Path::Queries>>(queries);
  }

  /// Rows of the partials are rounded up to this many lanes: the widest packet of any level (16 floats), so every
  /// level's lanes fit whichever level runs.
  static constexpr Index decode_lanes_multiple = 16;

  /// Room for the partials of calls over up to `keys` keys with `heads` (batch, key/value head) pairs of `rows`
  /// query rows each and values of `value_dim`: what a loop whose key count grows (a KV cache) reserves once.
  /// Throws std::length_error naming the arguments when the partials would exceed detail::max_elements(sizeof(T)),
  /// before anything is allocated; the counts are >= 0.
  void reserve(Index heads, Index rows, Index keys, Index value_dim) {
    const Index limit = max_elements(sizeof(T)), packet = decode_lanes_multiple;
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
    if (count == 0) return;
    // The task lists: at most every chunk of every pair, and one empty task per pair (fewer elements than count).
    task_first.reserve(static_cast<std::size_t>(heads * (chunks + 1)));
    task_last.reserve(static_cast<std::size_t>(heads * (chunks + 1)));
    task_head.reserve(static_cast<std::size_t>(heads * (chunks + 1)));
    task_begin.reserve(static_cast<std::size_t>(heads + 1));
  }
};

}  // namespace selfattn::detail
