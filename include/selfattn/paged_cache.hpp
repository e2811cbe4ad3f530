/// \file
/// PagedKVCache: the keys and values of many sequences in one pool of fixed-size pages, each sequence a table of
/// page numbers (vLLM's PagedAttention). Sequences start, grow a page at a time, fork (the child shares the
/// parent's pages; a shared page is copied when either writes into it) and end (their pages return to the pool), so
/// sequences of any lengths share one allocation that never fragments. paged_attention (paged_attention.hpp) runs
/// one decode step over any set of them in one call. docs/paged_cache.md.
#pragma once

#include <selfattn/errors.hpp>
#include <selfattn/half_precision.hpp>
#include <selfattn/quantized.hpp>
#include <selfattn/tensor.hpp>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace selfattn {

/// \brief The shape of a PagedKVCache's pool.
///
/// Memory: pages x kv_heads x page_rows x (head_dim + value_dim) elements of the storage type (int8: plus a
/// bfloat16 scale per 32), allocated once by the constructor (and by PagedKVCache::grow).
struct PagedCacheShape {
  Index pages = 0;        ///< pages in the pool
  Index kv_heads = 1;     ///< Hkv
  Index head_dim = 0;     ///< D of the keys
  Index value_dim = 0;    ///< Dv of the values; 0: head_dim
  Index page_rows = 256;  ///< tokens per page: a power of two in [16, 4096]; 256 (or more) is the decode kernel's chunk
};

/// \brief Keys and values of many sequences in one pool of pages (docs/paged_cache.md).
///
/// T: the compute type (float or double) of the rows appended and of attention over them. S: how they are stored:
/// T, bfloat16 or float16 (T = float: rounded to nearest, widened exactly as read), or std::int8_t (T = float: a
/// bfloat16 scale per block of 32, quantized.hpp's rule). A sequence is a number (`start`, `fork`) naming its table
/// of pages; key j of it is row j % page_rows of page table[j / page_rows]. Each page knows how many sequences
/// share it: appending into a shared page copies it first (copy on write), so a fork costs no copy until the two
/// differ, and then only of the page where they part.
///
/// Errors: std::invalid_argument naming `sequence` (not a live sequence), `shape` (a bad pool shape) or `length`;
/// ShapeError naming `keys` or `values`; std::length_error when the pool lacks free pages, naming how many an
/// append needs. Every check runs before anything changes.
/// \code
/// PagedKVCache<float> cache({/*pages=*/512, /*kv_heads=*/8, /*head_dim=*/128});
/// const Index prompt = cache.start();
/// cache.append(prompt, keys, values);          // (Hkv, n, D), (Hkv, n, Dv)
/// const Index reply = cache.fork(prompt);      // shares the prompt's pages
/// \endcode
template <typename T, typename S = T>
class PagedKVCache {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>,
                "selfattn: PagedKVCache computes in float or double");
  static_assert(std::is_same_v<S, T> ||
                    (std::is_same_v<T, float> &&
                     (std::is_same_v<S, bfloat16> || std::is_same_v<S, float16> || std::is_same_v<S, std::int8_t>)),
                "selfattn: PagedKVCache stores T, or for T = float bfloat16, float16 or std::int8_t");

 public:
  static constexpr bool quantized = std::is_same_v<S, std::int8_t>;  ///< int8 storage, with block scales
  static constexpr Index min_page_rows = 16;                         ///< the smallest page
  static constexpr Index max_page_rows = 4096;                       ///< the largest page

  /// A pool of shape.pages empty pages. Throws std::invalid_argument naming `shape` for a negative count, a
  /// dimension below 1 or page_rows not a power of two in [16, 4096].
  explicit PagedKVCache(const PagedCacheShape& shape) : shape_(checked(shape)) {
    allocate(shape_.pages);
    for (Index page = shape_.pages - 1; page >= 0; --page) free_.push_back(static_cast<std::int32_t>(page));
  }

  /// A new empty sequence; its number (numbers of ended sequences are reused).
  Index start() {
    Sequence fresh;
    fresh.live = true;
    return add(std::move(fresh));
  }

  /// A new sequence holding the tokens of `sequence`, sharing its pages (nothing copied until one of them appends
  /// into a shared page). Throws std::invalid_argument naming `sequence` when it is not live.
  Index fork(Index sequence) {
    Sequence child = live(sequence, "PagedKVCache::fork");
    for (const std::int32_t page : child.pages) ++shares_[static_cast<std::size_t>(page)];
    return add(std::move(child));
  }

  /// Ends a sequence: each of its pages that no other sequence shares returns to the pool. Throws
  /// std::invalid_argument naming `sequence` when it is not live.
  void end(Index sequence) {
    live(sequence, "PagedKVCache::end");
    Sequence& s = sequences_[static_cast<std::size_t>(sequence)];
    release_from(s, 0);
    s = Sequence();
    ended_.push_back(sequence);
  }

  /// Keeps the first `length` tokens of a sequence (rejected drafts), returning the pages past them to the pool when
  /// no other sequence shares them. Throws std::invalid_argument naming `sequence` or `length` (not in [0, length]).
  void truncate(Index sequence, Index length) {
    const Sequence& s = live(sequence, "PagedKVCache::truncate");
    if (length < 0 || length > s.length)
      detail::throw_invalid("PagedKVCache::truncate", "length",
                            "expected a value in [0, " + std::to_string(s.length) + "], got " + std::to_string(length));
    Sequence& target = sequences_[static_cast<std::size_t>(sequence)];
    release_from(target, pages_for(length));
    target.length = length;
  }

  /// \brief Appends n tokens to a sequence: keys (Hkv, n, D), values (Hkv, n, Dv), stored as S.
  ///
  /// Takes new pages from the pool as the sequence grows; a last page it shares with another sequence is copied
  /// first. Throws std::invalid_argument naming `sequence`, ShapeError naming `keys` or `values`, and
  /// std::length_error when the pool has fewer free pages than the append needs; the cache is then unchanged.
  void append(Index sequence, const TensorView<const T, 3>& keys, const TensorView<const T, 3>& values) {
    const char* fn = "PagedKVCache::append";
    const Sequence& s = live(sequence, "PagedKVCache::append");
    detail::check_shape<3>(fn, "keys", keys.shape(), {shape_.kv_heads, detail::any_extent, shape_.head_dim});
    detail::check_shape<3>(fn, "values", values.shape(), {shape_.kv_heads, keys.dim(1), shape_.value_dim});
    const Index n = keys.dim(1);
    if (n == 0) return;
    const Index partial = s.length % shape_.page_rows;  // rows in use of the last page
    const bool copies = partial > 0 && shares_[static_cast<std::size_t>(s.pages.back())] > 1;
    // A single sequence's need (pages_needed's rule for one holder, without its lists): its new pages, and a copy of
    // its last page where that is shared and partly used.
    const Index needed = pages_for(s.length + n) - static_cast<Index>(s.pages.size()) + (copies ? 1 : 0);
    if (needed > free_pages())
      throw std::length_error(std::string(fn) + ": the pool has " + std::to_string(free_pages()) +
                              " free pages, appending " + std::to_string(n) + " tokens to sequence " +
                              std::to_string(sequence) + " needs " + std::to_string(needed) + " (see grow)");
    Sequence& target = sequences_[static_cast<std::size_t>(sequence)];
    if (copies) copy_on_write(target, partial);
    while (static_cast<Index>(target.pages.size()) < pages_for(target.length + n)) target.pages.push_back(take());
    for (Index l = 0; l < n; ++l) {
      const Index j = target.length + l;
      const Index page = target.pages[static_cast<std::size_t>(j / shape_.page_rows)], row = j % shape_.page_rows;
      for (Index h = 0; h < shape_.kv_heads; ++h) {
        store_row(&keys(h, l, 0), shape_.head_dim, keys_, key_scales_, page, h, row);
        store_row(&values(h, l, 0), shape_.value_dim, values_, value_scales_, page, h, row);
      }
    }
    target.length += n;
  }

  /// The pages appending `tokens` to each of `sequences` takes from the pool, copies of shared pages included: what a
  /// scheduler checks against free_pages() before it admits a step. A shared last page that every listed holder
  /// appends into is copied once fewer times than it has holders (the last one finds it its own). Throws
  /// std::invalid_argument naming `sequence` when one is not live.
  Index pages_needed(const std::vector<Index>& sequences, Index tokens) const {
    Index needed = 0;
    std::vector<std::int32_t> shared;  // the shared partial last pages the appends write into, once per holder listed
    for (const Index sequence : sequences) {
      const Sequence& s = live(sequence, "PagedKVCache::pages_needed");
      if (tokens <= 0) continue;
      needed += pages_for(s.length + tokens) - static_cast<Index>(s.pages.size());
      if (s.length % shape_.page_rows > 0 && shares_[static_cast<std::size_t>(s.pages.back())] > 1)
        shared.push_back(s.pages.back());
    }
    std::sort(shared.begin(), shared.end());
    for (std::size_t i = 0; i < shared.size();) {
      std::size_t j = i;
      while (j < shared.size() && shared[j] == shared[i]) ++j;
      const Index holders = static_cast<Index>(j - i), all = shares_[static_cast<std::size_t>(shared[i])];
      needed += std::min(holders, all - 1);
      i = j;
    }
    return needed;
  }

  /// \overload
  void append(Index sequence, const Tensor<T, 3>& keys, const Tensor<T, 3>& values) {
    append(sequence, keys.view(), values.view());
  }

  /// Adds `more` empty pages to the pool (the pool is reallocated and copied: views taken before are invalid).
  /// Throws std::invalid_argument naming `more` when negative.
  void grow(Index more) {
    if (more < 0) detail::throw_invalid("PagedKVCache::grow", "more", "expected >= 0, got " + std::to_string(more));
    const Index before = shape_.pages;
    reallocate(before + more);
    for (Index page = before + more - 1; page >= before; --page) free_.push_back(static_cast<std::int32_t>(page));
  }

  /// The tokens of a live sequence.
  Index length(Index sequence) const { return live(sequence, "PagedKVCache::length").length; }
  /// A live sequence's pages, in order: token j is row j % page_rows() of page page_table(sequence)[j / page_rows()].
  const std::vector<std::int32_t>& page_table(Index sequence) const {
    return live(sequence, "PagedKVCache::page_table").pages;
  }
  /// Whether `sequence` names a live sequence (started or forked, not ended).
  bool is_live(Index sequence) const {
    return sequence >= 0 && sequence < static_cast<Index>(sequences_.size()) &&
           sequences_[static_cast<std::size_t>(sequence)].live;
  }
  /// Sequences sharing a page (1: only one; 0: free).
  Index shares(Index page) const { return shares_.at(static_cast<std::size_t>(page)); }

  /// The keys of a live sequence as T, (Hkv, length, D): widened or dequantised copies, for inspection and tests.
  Tensor<T, 3> keys(Index sequence) const { return gather(sequence, keys_, key_scales_, shape_.head_dim); }
  /// The values of a live sequence as T, (Hkv, length, Dv).
  Tensor<T, 3> values(Index sequence) const { return gather(sequence, values_, value_scales_, shape_.value_dim); }

  const PagedCacheShape& shape() const { return shape_; }                ///< the pool's shape (value_dim filled in)
  Index pages() const { return shape_.pages; }                           ///< pages in the pool
  Index page_rows() const { return shape_.page_rows; }                   ///< tokens per page
  Index kv_heads() const { return shape_.kv_heads; }                     ///< Hkv
  Index head_dim() const { return shape_.head_dim; }                     ///< D of the keys
  Index value_dim() const { return shape_.value_dim; }                   ///< Dv of the values
  Index free_pages() const { return static_cast<Index>(free_.size()); }  ///< pages no sequence holds
  Index used_pages() const { return shape_.pages - free_pages(); }       ///< pages some sequence holds
  /// Bytes of the pool (keys, values and int8 scales), used or not.
  std::size_t memory_bytes() const {
    return (keys_.size() + values_.size()) * sizeof(S) + (key_scales_.size() + value_scales_.size()) * sizeof(bfloat16);
  }
  /// Bytes of the pages in use: what the live sequences hold, shared pages once.
  std::size_t used_bytes() const {
    return shape_.pages == 0
               ? 0
               : memory_bytes() / static_cast<std::size_t>(shape_.pages) * static_cast<std::size_t>(used_pages());
  }

  /// The pools as the kernels address them: keys (pages, Hkv, page_rows, D), values (pages, Hkv, page_rows, Dv), and
  /// for int8 their scales (pages, Hkv, page_rows, int8_blocks(D or Dv)); empty scales otherwise. Stored head-major
  /// (Hkv, pages, page_rows, D), so that consecutive pages of a head are consecutive in memory: a sequence whose pages
  /// have consecutive numbers reads each head's keys as one stream, as from a contiguous cache.
  TensorView<const S, 4> key_pool() const { return by_page(keys_); }
  /// \copydoc key_pool
  TensorView<const S, 4> value_pool() const { return by_page(values_); }
  /// \copydoc key_pool
  TensorView<const bfloat16, 4> key_scale_pool() const { return by_page(key_scales_); }
  /// \copydoc key_pool
  TensorView<const bfloat16, 4> value_scale_pool() const { return by_page(value_scales_); }

 private:
  struct Sequence {
    bool live = false;
    Index length = 0;
    std::vector<std::int32_t> pages;
  };

  static PagedCacheShape checked(PagedCacheShape shape) {
    const char* fn = "PagedKVCache";
    const auto fail = [&](const std::string& what) { detail::throw_invalid(fn, "shape", what); };
    if (shape.value_dim == 0) shape.value_dim = shape.head_dim;
    if (shape.pages < 0) fail("expected pages >= 0, got " + std::to_string(shape.pages));
    if (shape.pages > std::numeric_limits<std::int32_t>::max())
      fail("expected pages below 2^31, got " + std::to_string(shape.pages));
    if (shape.kv_heads < 1) fail("expected kv_heads >= 1, got " + std::to_string(shape.kv_heads));
    if (shape.head_dim < 1) fail("expected head_dim >= 1, got " + std::to_string(shape.head_dim));
    if (shape.value_dim < 1) fail("expected value_dim >= 1 (or 0: head_dim), got " + std::to_string(shape.value_dim));
    const Index rows = shape.page_rows;
    if (rows < min_page_rows || rows > max_page_rows || (rows & (rows - 1)) != 0)
      fail("expected page_rows a power of two in [16, 4096], got " + std::to_string(rows));
    return shape;
  }

  const Sequence& live(Index sequence, const char* function) const {
    if (!is_live(sequence))
      detail::throw_invalid(function, "sequence",
                            "expected a live sequence (started or forked, not ended), got " + std::to_string(sequence));
    return sequences_[static_cast<std::size_t>(sequence)];
  }

  Index add(Sequence s) {
    if (!ended_.empty()) {
      const Index id = ended_.back();
      ended_.pop_back();
      sequences_[static_cast<std::size_t>(id)] = std::move(s);
      return id;
    }
    sequences_.push_back(std::move(s));
    return static_cast<Index>(sequences_.size()) - 1;
  }

  Index pages_for(Index tokens) const { return (tokens + shape_.page_rows - 1) / shape_.page_rows; }

  std::int32_t take() {
    const std::int32_t page = free_.back();
    free_.pop_back();
    shares_[static_cast<std::size_t>(page)] = 1;
    return page;
  }

  /// Drops the sequence's pages from index `first` on: a page no other sequence shares returns to the pool.
  void release_from(Sequence& s, Index first) {
    for (std::size_t i = static_cast<std::size_t>(first); i < s.pages.size(); ++i)
      if (--shares_[static_cast<std::size_t>(s.pages[i])] == 0) free_.push_back(s.pages[i]);
    s.pages.resize(static_cast<std::size_t>(std::min<Index>(first, static_cast<Index>(s.pages.size()))));
  }

  /// The sequence's last page, shared, replaced by a copy of its first `rows` rows that it alone holds.
  void copy_on_write(Sequence& s, Index rows) {
    const std::int32_t shared = s.pages.back(), own = take();
    --shares_[static_cast<std::size_t>(shared)];
    for (Index h = 0; h < shape_.kv_heads; ++h) {
      copy_rows(keys_, shared, own, h, rows);
      copy_rows(values_, shared, own, h, rows);
      if constexpr (quantized) {
        copy_rows(key_scales_, shared, own, h, rows);
        copy_rows(value_scales_, shared, own, h, rows);
      }
    }
    s.pages.back() = own;
  }

  template <typename U>
  static void copy_rows(Tensor<U, 4>& pool, Index from, Index to, Index h, Index rows) {
    std::memcpy(&pool(h, to, 0, 0), &pool(h, from, 0, 0), static_cast<std::size_t>(rows * pool.dim(3)) * sizeof(U));
  }

  void store_row(const T* row, Index width, Tensor<S, 4>& pool, Tensor<bfloat16, 4>& scales, Index page, Index h,
                 Index slot) {
    if constexpr (quantized)
      quantize_int8_row(row, width, &pool(h, page, slot, 0), &scales(h, page, slot, 0));
    else
      detail::convert_row(row, &pool(h, page, slot, 0), width);
  }

  Tensor<T, 3> gather(Index sequence, const Tensor<S, 4>& pool, const Tensor<bfloat16, 4>& scales, Index width) const {
    const Sequence& s = live(sequence, "PagedKVCache::keys");
    Tensor<T, 3> out({shape_.kv_heads, s.length, width});
    for (Index h = 0; h < shape_.kv_heads; ++h)
      for (Index j = 0; j < s.length; ++j) {
        const Index page = s.pages[static_cast<std::size_t>(j / shape_.page_rows)], row = j % shape_.page_rows;
        if constexpr (quantized) {
          for (Index e = 0; e < width; ++e)
            out(h, j, e) = dequantize_int8(&pool(h, page, row, 0), &scales(h, page, row, 0), e);
        } else {
          detail::convert_row(&pool(h, page, row, 0), &out(h, j, 0), width);
        }
      }
    return out;
  }

  void allocate(Index pages) {
    keys_ = Tensor<S, 4>({shape_.kv_heads, pages, shape_.page_rows, shape_.head_dim});
    values_ = Tensor<S, 4>({shape_.kv_heads, pages, shape_.page_rows, shape_.value_dim});
    if constexpr (quantized) {
      key_scales_ = Tensor<bfloat16, 4>({shape_.kv_heads, pages, shape_.page_rows, int8_blocks(shape_.head_dim)});
      value_scales_ = Tensor<bfloat16, 4>({shape_.kv_heads, pages, shape_.page_rows, int8_blocks(shape_.value_dim)});
    }
    shares_.assign(static_cast<std::size_t>(pages), 0);
    shape_.pages = pages;
  }

  /// The pool with room for `pages` pages, its first pages those of `pool` (pages are its outermost dimension).
  template <typename U>
  static Tensor<U, 4> grown(const Tensor<U, 4>& pool, Index pages) {
    if (pool.dim(0) == 0) return pool;  // no scales: stays empty
    Tensor<U, 4> bigger({pool.dim(0), pages, pool.dim(2), pool.dim(3)});
    const Index plane = pool.dim(1) * pool.dim(2) * pool.dim(3);  // one head's pages
    for (Index h = 0; h < pool.dim(0); ++h)
      std::copy(pool.data() + h * plane, pool.data() + (h + 1) * plane, &bigger(h, 0, 0, 0));
    return bigger;
  }

  /// A head-major pool (Hkv, pages, P, D) seen as (pages, Hkv, P, D), the order the kernels address it in.
  template <typename U>
  static TensorView<const U, 4> by_page(const Tensor<U, 4>& pool) {
    const std::array<Index, 4> strides = pool.strides();
    return TensorView<const U, 4>(pool.data(), {pool.dim(1), pool.dim(0), pool.dim(2), pool.dim(3)},
                                  {strides[1], strides[0], strides[2], strides[3]});
  }

  void reallocate(Index pages) {
    keys_ = grown(keys_, pages);
    values_ = grown(values_, pages);
    key_scales_ = grown(key_scales_, pages);
    value_scales_ = grown(value_scales_, pages);
    shares_.resize(static_cast<std::size_t>(pages), 0);
    shape_.pages = pages;
  }

  PagedCacheShape shape_;
  Tensor<S, 4> keys_, values_;
  Tensor<bfloat16, 4> key_scales_, value_scales_;
  std::vector<std::int32_t> shares_;  // per page: sequences holding it
  std::vector<std::int32_t> free_;    // pages no sequence holds, taken from the back
  std::vector<Sequence> sequences_;
  std::vector<Index> ended_;  // numbers of ended sequences, reused by start and fork
};

}  // namespace selfattn
