// selfattn/detail/decode_rows.hpp — what the three decode paths (kernels/decode_general.inc, decode_grouped.inc,
// decode_streaming.inc) share: their names, the query rows of one (batch, key/value head) with their masks, and the
// partial result a path writes for one chunk of keys. The driver that cuts the keys into chunks, runs a path on each and
// merges the partials is kernels/decode_driver.inc.
//
// Decoding computes few query rows over many keys: every key and value row of a key/value head serves the
// R = G * Lq query rows of its group (G = H / Hkv query heads, Lq rows each), so the decode kernel works per
// (batch, key/value head) on all R rows at once, row r = g * Lq + i being query row i of head kv_head * G + g.
#pragma once

#include <selfattn/detail/mask.hpp>
#include <selfattn/detail/params.hpp>
#include <selfattn/detail/softmax.hpp>
#include <selfattn/tensor.hpp>

#include <algorithm>
#include <vector>

namespace selfattn::detail {

/// Keys per chunk of every decode path: 256 rows of K and V (D = 128, float: 128 KB each) and the next chunk's,
/// prefetched while this one is computed, fit in L2 together, and a chunk's scores (256 keys x 16 float lanes:
/// 16 KB) stay in L1; 32k keys give 128 chunks per key/value head to share among threads. (128 and 512 measured
/// within noise of 256 on both fast paths.)
constexpr Index decode_chunk = 256;

/// The path of the decode kernel that computes a call (decode.hpp's rule, decode_path, picks one).
enum class DecodePath {
  general,   ///< any mask, bias, ALiBi or dropout (kernels/decode_general.inc)
  grouped,   ///< no per-element mask, no dropout: rows of a key/value head's group in SIMD lanes
  streaming  ///< the grouped path's conditions and at most streaming_max_rows rows per key/value head
};

/// The R query rows of one (batch b, key/value head kv_head), their masks (MaskParams::row) and the key spans
/// the chunks need.
template <typename T>
struct DecodeRows {
  Index batch = 0;                  ///< b
  Index kv_head = 0;                ///< the key/value head
  Index group = 1;                  ///< G, query heads per key/value head
  Index q_len = 0;                  ///< Lq
  std::vector<RowMask<T>> masks;    ///< one per row r
  Index first_key = 0;              ///< keys some row may see: [first_key, last_key)
  Index last_key = 0;
  Index common_begin = 0;           ///< keys every row sees: [common_begin, common_end)
  Index common_end = 0;

  Index rows() const { return static_cast<Index>(masks.size()); }
  Index head(Index r) const { return kv_head * group + r / q_len; }  ///< the query head of row r
  Index query_row(Index r) const { return r % q_len; }              ///< i of row r
  /// Whether every row sees every key of [lo, hi): then a chunk needs no range check at all.
  bool all_see(Index lo, Index hi) const { return common_begin <= lo && hi <= common_end; }
};

/// Fills `rows` with the rows of (batch b, key/value head kv_head); within the capacity of rows.masks nothing is
/// allocated.
template <typename T, typename KV>
void decode_rows(const AttentionParams<T, KV>& p, Index b, Index kv_head, DecodeRows<T>& rows) {
  rows.masks.clear();
  rows.batch = b;
  rows.kv_head = kv_head;
  rows.group = p.group();
  rows.q_len = p.q_len();
  rows.first_key = p.k_len();
  rows.last_key = 0;
  rows.common_begin = 0;
  rows.common_end = p.k_len();
  for (Index r = 0; r < rows.group * rows.q_len; ++r) {
    const RowMask<T> mask = p.mask.row(b, rows.head(r), rows.query_row(r));
    rows.masks.push_back(mask);
    rows.first_key = std::min(rows.first_key, mask.keys.begin);
    rows.last_key = std::max(rows.last_key, mask.keys.end);
    rows.common_begin = std::max(rows.common_begin, mask.keys.begin);
    rows.common_end = std::min(rows.common_end, mask.keys.end);
  }
}

template <typename T, typename KV>
DecodeRows<T> decode_rows(const AttentionParams<T, KV>& p, Index b, Index kv_head) {
  DecodeRows<T> rows;
  decode_rows(p, b, kv_head, rows);
  return rows;
}

/// The unnormalised partial result of one chunk (softmax.hpp's rule 5): per row r its maximum m_r and sum
/// l_r = sum_j exp(s_rj - shift(m_r)), and acc(r, e) = sum_j exp(s_rj - shift(m_r)) w_rj v_j[e] (w the dropout
/// factor) at acc[r * row_stride + e * column_stride]: row-major (column_stride 1) or lane-major (row_stride 1).
template <typename T>
struct DecodePartial {
  T* max;
  T* sum;
  T* acc;
  Index row_stride;
  Index column_stride;

  T& value(Index r, Index e) const { return acc[r * row_stride + e * column_stride]; }
};

/// A chunk no row sees: every row empty (max -inf, sum 0, acc 0).
template <typename T>
void empty_partial(const DecodePartial<T>& part, Index lanes, Index value_dim) {
  std::fill(part.max, part.max + lanes, -std::numeric_limits<T>::infinity());
  std::fill(part.sum, part.sum + lanes, T(0));
  std::fill(part.acc, part.acc + lanes * value_dim, T(0));
}

/// The block scales of rows of int8 storage (quantized.hpp): block c of row j at data[j * ld + c]. Other storage
/// has none (data null), and the readers ignore them.
struct RowScales {
  const bfloat16* data = nullptr;
  Index ld = 0;

  const bfloat16* row(Index j) const { return data ? data + j * ld : nullptr; }
};

/// Where one key row and its value row are stored, with their scales (int8 storage; else none).
template <typename KV>
struct StoredRow {
  const KV* k;
  const KV* v;
  RowScales k_scales;
  RowScales v_scales;
};

/// Key row j of (batch b, key/value head h): row j of the (B, Hkv, Lk, D) tensors, or of a pool's page
/// (KeyPages) when the call is paged.
template <typename T, typename KV>
StoredRow<KV> stored_row(const AttentionParams<T, KV>& p, Index b, Index h, Index j) {
  const Index slot = p.pages.present() ? p.pages.page(b, j) : b;
  const Index row = p.pages.present() ? j & (p.pages.page_rows - 1) : j;
  const auto scales_at = [&](const TensorView<const bfloat16, 4>& scales) {
    if (!scales.data()) return RowScales{};
    return RowScales{scales.data() + slot * scales.stride(0) + h * scales.stride(1) + row * scales.stride(2),
                     scales.stride(2)};
  };
  return {row_pointer(p.k, slot, h, row), row_pointer(p.v, slot, h, row), scales_at(p.k_scales), scales_at(p.v_scales)};
}

/// One chunk's keys: [lo, hi) of this (batch, key/value head), numbered as the masks number them, stored at k and v
/// (row lo + j at k + j * ldk), contiguous within the chunk; and the next chunk's first rows some row may see, which a
/// path may prefetch while it computes this one. KV: the storage type of keys and values (T, 16 bits widened as they
/// are read, or int8 dequantised as they are read).
template <typename KV>
struct DecodeChunk {
  const KV* k;  ///< key row lo; row lo + j at k + j * ldk
  Index ldk;
  const KV* v;  ///< value row lo; row lo + j at v + j * ldv
  Index ldv;
  Index lo;                 ///< first key of the chunk that some row sees
  Index hi;                 ///< one past the last
  const KV* next_k;         ///< the next chunk's first key row some row sees (null: none), rows ldk apart
  const KV* next_v;         ///< its value row, rows ldv apart
  Index next_rows;          ///< rows of the next chunk to prefetch
  bool masked;              ///< some row does not see every key of [lo, hi)
  RowScales k_scales = {};  ///< KV = std::int8_t: the scales of key row lo (row lo + j's at k_scales.row(j)); else none
  RowScales v_scales = {};  ///< KV = std::int8_t: the scales of value row lo
};

}  // namespace selfattn::detail
