/// \file
/// SequenceLayout: how a sequence of L tokens is split across P ranks for ring attention (selfattn/distributed.hpp),
/// the token ranges each rank holds, and the helpers that cut a rank's block out of a whole-sequence tensor and put
/// it back. Plain arithmetic on positions: no MPI here, so programs that only prepare or check blocks need no MPI.
///
/// The sequence is cut into chunks whose lengths differ by at most one token (the first L % n chunks are one token
/// longer), so any L works with any P, including L < P (some ranks then hold no token):
/// \code{.unparsed}
///   L = 13, P = 2, contiguous (2 chunks):  rank 0: [0, 7)            rank 1: [7, 13)
///   L = 13, P = 2, zigzag     (4 chunks):  rank 0: [0, 4) + [10, 13) rank 1: [4, 7) + [7, 10)
/// \endcode
#pragma once

#include <selfattn/errors.hpp>
#include <selfattn/tensor.hpp>

#include <algorithm>
#include <array>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace selfattn {

/// \brief Which tokens of a sequence each of P ranks holds.
///
/// With causal attention a query sees only earlier keys, so under `contiguous` rank P - 1 does 2P - 1 times the work
/// of rank 0. `zigzag` cuts the sequence into 2P chunks and gives rank r chunks r and 2P - 1 - r: one early and one
/// late chunk each, so every rank does the same causal work (up to one token per chunk).
enum class SequenceLayout {
  contiguous,  ///< P chunks: rank r holds chunk r (tokens in order across ranks)
  zigzag       ///< 2P chunks: rank r holds chunks r and 2P - 1 - r, in that order in its rows
};

/// \brief A half-open range [begin, end) of global token positions.
struct TokenRange {
  Index begin = 0;  ///< first position
  Index end = 0;    ///< one past the last position
  /// Number of tokens, end - begin.
  Index size() const { return end - begin; }
};

namespace detail {

/// Chunk `chunk` of `length` tokens cut into `chunks` chunks of lengths differing by at most one (longer first).
inline TokenRange chunk_range(Index length, Index chunks, Index chunk) {
  const Index base = length / chunks, extra = length % chunks;
  const Index begin = chunk * base + std::min(chunk, extra);
  return {begin, begin + base + (chunk < extra ? 1 : 0)};
}

/// Throws std::invalid_argument unless ranks >= 1, 0 <= rank < ranks and length >= 0.
inline void check_layout_arguments(const char* function, Index length, int rank, int ranks) {
  if (ranks < 1) throw_invalid(function, "ranks", "expected >= 1, got " + std::to_string(ranks));
  if (rank < 0 || rank >= ranks)
    throw_invalid(function, "rank",
                  "expected a value in [0, " + std::to_string(ranks) + "), got " + std::to_string(rank));
  if (length < 0) throw_invalid(function, "length", "expected >= 0, got " + std::to_string(length));
}

/// The global ranges of a rank, in the order of its local rows (validated arguments).
inline std::vector<TokenRange> sequence_ranges_unchecked(SequenceLayout layout, Index length, int rank, int ranks) {
  if (layout == SequenceLayout::contiguous) return {chunk_range(length, ranks, rank)};
  const Index chunks = 2 * static_cast<Index>(ranks);
  return {chunk_range(length, chunks, rank), chunk_range(length, chunks, chunks - 1 - rank)};
}

/// A rank-3 (B, H, L) view as a rank-4 (B, H, L, 1) one, so that one copy loop serves lse and tensors alike.
template <typename T>
TensorView<T, 4> with_unit_last_dim(const TensorView<T, 3>& x) {
  return TensorView<T, 4>(x.data(), {x.dim(0), x.dim(1), x.dim(2), 1}, {x.stride(0), x.stride(1), 1, 1});
}
template <typename T>
TensorView<T, 4> with_unit_last_dim(const TensorView<T, 4>& x) {
  return x;
}

/// Copies rows (dimension 2) [from_row, from_row + rows) of `from` to rows [to_row, to_row + rows) of `to`.
template <typename T>
void copy_sequence_rows(const TensorView<const T, 4>& from, Index from_row, const TensorView<T, 4>& to, Index to_row,
                        Index rows) {
  const Index width = from.dim(3);
  if (width == 0) return;  // nothing to copy (and no element 0 to address)
  for (Index b = 0; b < from.dim(0); ++b)
    for (Index h = 0; h < from.dim(1); ++h)
      for (Index i = 0; i < rows; ++i) {
        const T* source = &from(b, h, from_row + i, 0);
        std::copy(source, source + width, &to(b, h, to_row + i, 0));
      }
}

}  // namespace detail

/// \brief The global token ranges rank `rank` of `ranks` holds for a sequence of `length` tokens, in the order of
/// its local rows: one range under `contiguous`, two under `zigzag` (either may be empty).
///
/// Throws std::invalid_argument for ranks < 1, a rank outside [0, ranks) or a negative length.
/// \code
/// auto ranges = sequence_ranges(SequenceLayout::zigzag, 13, 0, 2);   // {[0, 4), [10, 13)}
/// \endcode
inline std::vector<TokenRange> sequence_ranges(SequenceLayout layout, Index length, int rank, int ranks) {
  detail::check_layout_arguments("sequence_ranges", length, rank, ranks);
  return detail::sequence_ranges_unchecked(layout, length, rank, ranks);
}

/// \brief The number of tokens rank `rank` of `ranks` holds for a sequence of `length` tokens: its L_r, the
/// length (dimension 2) of its q, k and v blocks. The L_r of all ranks add up to `length`.
///
/// Throws like sequence_ranges.
/// \code
/// Index rows = sequence_block_length(SequenceLayout::contiguous, 13, 3, 4);   // 3 (ranks hold 4, 3, 3, 3)
/// \endcode
inline Index sequence_block_length(SequenceLayout layout, Index length, int rank, int ranks) {
  Index total = 0;
  for (const TokenRange& range : sequence_ranges(layout, length, rank, ranks)) total += range.size();
  return total;
}

/// \brief A copy of rank `rank`'s block of a whole-sequence tensor: the rows (dimension 2) the layout gives the
/// rank, in its local order.
///
/// Shapes: whole (B, H, L, D) -> (B, H, L_r, D), or whole (B, H, L) (an lse) -> (B, H, L_r). Throws like
/// sequence_ranges.
/// \code
/// Tensor<double, 4> q_block = sequence_block(q, SequenceLayout::zigzag, rank, ranks);   // this rank's queries
/// \endcode
template <typename X>
Tensor<detail::scalar_of<X>, detail::tensor_traits<std::decay_t<X>>::rank> sequence_block(const X& whole,
                                                                                         SequenceLayout layout,
                                                                                         int rank, int ranks) {
  using T = detail::scalar_of<X>;
  constexpr int Rank = detail::tensor_traits<std::decay_t<X>>::rank;
  static_assert(Rank == 3 || Rank == 4,
                "sequence_block: whole must be a (B, H, L, D) or (B, H, L) Tensor or TensorView");
  const TensorView<const T, Rank> source = detail::const_view(whole);
  detail::check_layout_arguments("sequence_block", source.dim(2), rank, ranks);
  std::array<Index, Rank> shape = source.shape();
  shape[2] = sequence_block_length(layout, source.dim(2), rank, ranks);
  Tensor<T, Rank> block(shape);
  Index row = 0;
  for (const TokenRange& range : detail::sequence_ranges_unchecked(layout, source.dim(2), rank, ranks)) {
    detail::copy_sequence_rows<T>(detail::with_unit_last_dim(source), range.begin,
                                  detail::with_unit_last_dim(block.view()), row, range.size());
    row += range.size();
  }
  return block;
}

/// \brief Writes rank `rank`'s block into its rows of a whole-sequence tensor: the inverse of sequence_block. Call
/// it for every rank's block (gathered, e.g., with MPI_Gatherv) to put the whole sequence back together.
///
/// Shapes: block (B, H, L_r, D) into whole (B, H, L, D), or (B, H, L_r) into (B, H, L). Throws like
/// sequence_ranges, and ShapeError naming `block` when its shape is not the rank's part of `whole`'s.
/// \code
/// for (int r = 0; r < ranks; ++r) place_sequence_block(out_blocks[r], out, SequenceLayout::zigzag, r, ranks);
/// \endcode
template <typename X, typename T, int Rank>
void place_sequence_block(const X& block, const TensorView<T, Rank>& whole, SequenceLayout layout, int rank,
                          int ranks) {
  static_assert(Rank == 3 || Rank == 4, "place_sequence_block: whole must be a (B, H, L, D) or (B, H, L) tensor");
  static_assert(detail::is_tensor_of_rank<X, Rank> && std::is_same_v<detail::scalar_of<X>, std::remove_const_t<T>>,
                "place_sequence_block: block must be a Tensor or TensorView of whole's rank and element type");
  static_assert(!std::is_const_v<T>, "place_sequence_block: whole must be writable");
  const TensorView<const T, Rank> source = detail::const_view(block);
  detail::check_layout_arguments("place_sequence_block", whole.dim(2), rank, ranks);
  std::array<Index, Rank> expected = whole.shape();
  expected[2] = sequence_block_length(layout, whole.dim(2), rank, ranks);
  detail::check_shape<static_cast<std::size_t>(Rank)>("place_sequence_block", "block", source.shape(), expected);
  Index row = 0;
  for (const TokenRange& range : detail::sequence_ranges_unchecked(layout, whole.dim(2), rank, ranks)) {
    detail::copy_sequence_rows<T>(detail::with_unit_last_dim(source), row, detail::with_unit_last_dim(whole),
                                  range.begin, range.size());
    row += range.size();
  }
}

/// \brief place_sequence_block into a Tensor.
template <typename X, typename T, int Rank>
void place_sequence_block(const X& block, Tensor<T, Rank>& whole, SequenceLayout layout, int rank, int ranks) {
  place_sequence_block(block, whole.view(), layout, rank, ranks);
}

}  // namespace selfattn
