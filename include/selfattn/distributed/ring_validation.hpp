/// \file
/// The argument check of ring attention (selfattn/distributed.hpp), run by every rank together: each rank packs its
/// shapes and options into a fixed-size record, one MPI_Allgather gives every rank all records, and every rank runs
/// the same checks on the same records, so that a mistake on one rank throws the same exception on all of them
/// (never a hang in the ring). Internal: include selfattn/distributed.hpp.
#pragma once

#include <selfattn/distributed/mpi_support.hpp>

#if SELFATTN_HAS_MPI || defined(SELFATTN_DOXYGEN)
#include <selfattn/attention.hpp>
#include <selfattn/distributed/sequence_layout.hpp>
#include <selfattn/errors.hpp>
#include <selfattn/options.hpp>
#include <selfattn/tensor.hpp>

#include <algorithm>
#include <array>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace selfattn::detail {

/// What a validated ring call is about, the same on every rank (but `rank`).
struct RingProblem {
  SequenceLayout layout = SequenceLayout::contiguous;  ///< how the sequence is split
  int rank = 0;                                        ///< this rank
  int ranks = 1;                                       ///< P
  Index batch = 0;                                     ///< B
  Index heads = 0;                                     ///< H
  Index kv_heads = 0;                                  ///< Hkv
  Index head_dim = 0;                                  ///< D
  Index value_dim = 0;                                 ///< Dv
  Index q_length = 0;                                  ///< L of the queries (the sum over ranks)
  Index k_length = 0;                                  ///< L of the keys (the sum over ranks)
  Index max_block_keys = 0;                            ///< the most keys any rank holds
};

/// The backward's extra inputs on this rank: out (B, H, L_r, Dv), lse (B, H, L_r), dout (B, H, L_r, Dv).
template <typename T>
struct RingGradientInputs {
  TensorView<const T, 4> out;   ///< the forward's output rows of this rank
  TensorView<const T, 3> lse;   ///< the forward's log-sum-exp rows of this rank
  TensorView<const T, 4> dout;  ///< the upstream gradient rows of this rank
};

/// Where each value sits in the record a rank shares (std::int64_t each).
namespace ring_field {
constexpr std::size_t element_size = 0, layout = 1, backward = 2, q = 3, k = 7, v = 11, out = 15, lse = 19, dout = 22,
                      causal = 26, key_lengths = 27, has_scale = 28, scale_bits = 29, dropout = 30, alibi = 31,
                      bias = 32, allowed = 33, window_left = 34, window_right = 35, need_weights = 36, softcap = 37,
                      sinks = 38, count = 39;
}  // namespace ring_field
using RingRecord = std::array<std::int64_t, ring_field::count>;

template <std::size_t Rank>
void put_shape(RingRecord& record, std::size_t at, const std::array<Index, Rank>& shape) {
  for (std::size_t d = 0; d < Rank; ++d) record[at + d] = static_cast<std::int64_t>(shape[d]);
}
template <std::size_t Rank>
std::array<Index, Rank> shape_at(const RingRecord& record, std::size_t at) {
  std::array<Index, Rank> shape{};
  for (std::size_t d = 0; d < Rank; ++d) shape[d] = static_cast<Index>(record[at + d]);
  return shape;
}

/// This rank's record: element type, layout, which call, every shape, and every option that must agree.
template <typename T>
RingRecord make_ring_record(SequenceLayout layout, const TensorView<const T, 4>& q, const TensorView<const T, 4>& k,
                            const TensorView<const T, 4>& v, const RingGradientInputs<T>* upstream,
                            const AttentionOptions<T>& opts) {
  RingRecord record{};
  record[ring_field::element_size] = static_cast<std::int64_t>(sizeof(T));
  record[ring_field::layout] = layout == SequenceLayout::zigzag ? 1 : 0;
  record[ring_field::backward] = upstream ? 1 : 0;
  put_shape<4>(record, ring_field::q, q.shape());
  put_shape<4>(record, ring_field::k, k.shape());
  put_shape<4>(record, ring_field::v, v.shape());
  if (upstream) {
    put_shape<4>(record, ring_field::out, upstream->out.shape());
    put_shape<3>(record, ring_field::lse, upstream->lse.shape());
    put_shape<4>(record, ring_field::dout, upstream->dout.shape());
  }
  record[ring_field::causal] = opts.causal == Causal::none ? 0 : 1;  // top_left == bottom_right: one sequence
  record[ring_field::key_lengths] = static_cast<std::int64_t>(opts.key_lengths.size());
  record[ring_field::has_scale] = opts.scale ? 1 : 0;
  if (opts.scale) {
    const double scale = static_cast<double>(*opts.scale);
    std::memcpy(&record[ring_field::scale_bits], &scale, sizeof scale);
  }
  record[ring_field::dropout] = opts.dropout_p != T(0) ? 1 : 0;
  record[ring_field::alibi] = static_cast<std::int64_t>(opts.alibi_slopes.size());
  record[ring_field::bias] = opts.bias.data() ? 1 : 0;
  record[ring_field::allowed] = opts.allowed.data() ? 1 : 0;
  record[ring_field::window_left] = static_cast<std::int64_t>(opts.window_left);
  record[ring_field::window_right] = static_cast<std::int64_t>(opts.window_right);
  record[ring_field::need_weights] = opts.need_weights ? 1 : 0;
  record[ring_field::softcap] = opts.softcap != T(0) ? 1 : 0;
  record[ring_field::sinks] = opts.sinks.empty() ? 0 : 1;
  return record;
}

inline std::string on_rank(const char* argument, int rank) {
  return std::string(argument) + " on rank " + std::to_string(rank);
}

/// The checks of one rank's own arguments (those sdpa_forward / sdpa_backward would make), and the options ring
/// attention does not support. `r` names the rank in the messages.
inline void check_rank_arguments(const char* function, const RingRecord& record, int r) {
  const auto q = shape_at<4>(record, ring_field::q), k = shape_at<4>(record, ring_field::k),
             v = shape_at<4>(record, ring_field::v);
  if (q[3] < 1)
    throw_shape_error(function, on_rank("q", r), "head dim D must be >= 1, got shape " + shape_string<4>(q));
  check_shape<4>(function, on_rank("k", r), k, {q[0], any_extent, any_extent, q[3]});
  if (k[1] < 1 || q[1] % k[1] != 0)
    throw_shape_error(function, on_rank("k", r),
                      "the number of key/value heads (dim 1) must divide the " + std::to_string(q[1]) +
                          " query heads, got shape " + shape_string<4>(k));
  check_shape<4>(function, on_rank("v", r), v, {k[0], k[1], k[2], any_extent});
  if (record[ring_field::backward]) {
    const std::array<Index, 4> out_shape{q[0], q[1], q[2], v[3]};
    check_shape<4>(function, on_rank("out", r), shape_at<4>(record, ring_field::out), out_shape);
    check_shape<3>(function, on_rank("lse", r), shape_at<3>(record, ring_field::lse), {q[0], q[1], q[2]});
    check_shape<4>(function, on_rank("dout", r), shape_at<4>(record, ring_field::dout), out_shape);
  }
  const auto unsupported = [&](const char* option, const char* why) {
    throw_invalid(function, on_rank(option, r), std::string("not supported by ring attention (") + why + ")");
  };
  const char* global = "it is defined over the whole sequence, which no rank holds";
  if (record[ring_field::dropout]) unsupported("opts.dropout_p", "dropout: leave it 0");
  if (record[ring_field::alibi]) unsupported("opts.alibi_slopes", global);
  if (record[ring_field::bias]) unsupported("opts.bias", global);
  if (record[ring_field::allowed]) unsupported("opts.allowed", global);
  if (record[ring_field::window_left] != -1 || record[ring_field::window_right] != -1)
    unsupported("opts.window_left/window_right", "sliding windows: leave both -1");
  if (record[ring_field::need_weights]) unsupported("opts.need_weights", "no rank holds a whole row of weights");
  if (record[ring_field::softcap]) unsupported("opts.softcap", "not implemented yet: leave it 0");
  if (record[ring_field::sinks]) unsupported("opts.sinks", "not implemented yet: leave it empty");
  if (record[ring_field::key_lengths] != 0 && record[ring_field::key_lengths] != q[0])
    throw_shape_error(function, on_rank("opts.key_lengths", r),
                      "expected " + std::to_string(q[0]) + " entries (one per batch), got " +
                          std::to_string(record[ring_field::key_lengths]));
  if (record[ring_field::has_scale]) {
    double scale = 0;
    std::memcpy(&scale, &record[ring_field::scale_bits], sizeof scale);
    if (!std::isfinite(scale))
      throw_invalid(function, on_rank("opts.scale", r), "expected a finite value, got " + std::to_string(scale));
  }
}

/// Throws ShapeError unless rank r's `argument` has the extents of rank 0's where `expected` is not any_extent.
inline void check_like_rank_zero(const char* function, const char* argument, int r, const std::array<Index, 4>& actual,
                                 const std::array<Index, 4>& expected) {
  for (std::size_t d = 0; d < 4; ++d)
    if (expected[d] != any_extent && actual[d] != expected[d])
      throw_shape_error(function, on_rank(argument, r),
                        "expected shape " + expected_shape_string(expected) + " as on rank 0, got " +
                            expected_shape_string(actual));
}

/// Every rank's arguments against each other's: element type, call, layout, B, H, Hkv, D, Dv and options as on
/// rank 0; then each rank's lengths against the layout's split of the total.
inline RingProblem check_ring_records(const char* function, const std::vector<RingRecord>& records, int rank) {
  const RingRecord& first = records.front();
  const int ranks = static_cast<int>(records.size());
  const auto type_name = [](std::int64_t size) { return size == 4 ? std::string("float") : std::string("double"); };
  for (int r = 0; r < ranks; ++r) {
    const RingRecord& record = records[static_cast<std::size_t>(r)];
    if (record[ring_field::backward] != first[ring_field::backward])
      throw_invalid(function, "rank " + std::to_string(r),
                    std::string("calls ") +
                        (record[ring_field::backward] ? "ring_attention_backward" : "ring_attention_forward") +
                        " while rank 0 calls " +
                        (first[ring_field::backward] ? "ring_attention_backward" : "ring_attention_forward") +
                        ": every rank must make the same call");
    if (record[ring_field::element_size] != first[ring_field::element_size])
      throw_invalid(function, on_rank("q", r),
                    "holds " + type_name(record[ring_field::element_size]) + ", rank 0's " +
                        type_name(first[ring_field::element_size]) + ": every rank must use one element type");
    if (record[ring_field::layout] != first[ring_field::layout])
      throw_invalid(function, on_rank("layout", r),
                    std::string("is ") + (record[ring_field::layout] ? "zigzag" : "contiguous") + ", rank 0's " +
                        (first[ring_field::layout] ? "zigzag" : "contiguous") + ": every rank must use one layout");
    check_rank_arguments(function, record, r);
  }
  const auto q0 = shape_at<4>(first, ring_field::q), k0 = shape_at<4>(first, ring_field::k),
             v0 = shape_at<4>(first, ring_field::v);
  RingProblem problem;
  problem.layout = first[ring_field::layout] ? SequenceLayout::zigzag : SequenceLayout::contiguous;
  problem.rank = rank;
  problem.ranks = ranks;
  problem.batch = q0[0];
  problem.heads = q0[1];
  problem.kv_heads = k0[1];
  problem.head_dim = q0[3];
  problem.value_dim = v0[3];
  for (int r = 0; r < ranks; ++r) {
    const RingRecord& record = records[static_cast<std::size_t>(r)];
    const auto q = shape_at<4>(record, ring_field::q), k = shape_at<4>(record, ring_field::k);
    check_like_rank_zero(function, "q", r, q, {q0[0], q0[1], any_extent, q0[3]});
    check_like_rank_zero(function, "k", r, k, {k0[0], k0[1], any_extent, k0[3]});
    check_like_rank_zero(function, "v", r, shape_at<4>(record, ring_field::v),
                         {any_extent, any_extent, any_extent, v0[3]});
    if (record[ring_field::causal] != first[ring_field::causal])
      throw_invalid(function, on_rank("opts.causal", r),
                    std::string(record[ring_field::causal] ? "causal" : "Causal::none") + ", rank 0's " +
                        (first[ring_field::causal] ? "causal" : "Causal::none") +
                        ": every rank must pass the same options");
    if ((record[ring_field::key_lengths] != 0) != (first[ring_field::key_lengths] != 0))
      throw_invalid(function, on_rank("opts.key_lengths", r),
                    std::string(record[ring_field::key_lengths] ? "set" : "empty") + ", rank 0's " +
                        (first[ring_field::key_lengths] ? "set" : "empty") + ": every rank must pass the same options");
    if (record[ring_field::has_scale] != first[ring_field::has_scale] ||
        (record[ring_field::has_scale] && record[ring_field::scale_bits] != first[ring_field::scale_bits]))
      throw_invalid(function, on_rank("opts.scale", r), "differs from rank 0's: every rank must pass the same options");
    problem.q_length += q[2];
    problem.k_length += k[2];
  }
  if (first[ring_field::causal] && problem.q_length != problem.k_length)
    throw_invalid(function, "opts.causal",
                  "needs queries and keys of one sequence, got " + std::to_string(problem.q_length) + " queries and " +
                      std::to_string(problem.k_length) + " keys over all ranks");
  const char* layout_name = problem.layout == SequenceLayout::zigzag ? "zigzag" : "contiguous";
  for (int r = 0; r < ranks; ++r) {
    const RingRecord& record = records[static_cast<std::size_t>(r)];
    const auto check_length = [&](const char* argument, std::size_t field, Index total) {
      auto expected = shape_at<4>(record, field);
      const Index actual = expected[2];
      expected[2] = sequence_block_length(problem.layout, total, r, ranks);
      if (actual != expected[2])
        throw_shape_error(function, on_rank(argument, r),
                          "expected shape " + shape_string<4>(expected) + " (rank " + std::to_string(r) + "'s " +
                              std::to_string(expected[2]) + " of the " + std::to_string(total) + " tokens all ranks " +
                              "pass, under the " + layout_name + " layout), got " +
                              shape_string<4>(shape_at<4>(record, field)));
    };
    check_length("q", ring_field::q, problem.q_length);
    check_length("k", ring_field::k, problem.k_length);
    problem.max_block_keys = std::max(problem.max_block_keys, static_cast<Index>(record[ring_field::k + 2]));
  }
  // A block (k and v, or dk and dv) travels as one message of B Hkv L_r (D + Dv) elements: MPI counts are ints.
  const double block_elements = static_cast<double>(problem.batch) * static_cast<double>(problem.kv_heads) *
                                static_cast<double>(problem.max_block_keys) *
                                static_cast<double>(problem.head_dim + problem.value_dim);
  if (block_elements > static_cast<double>(INT_MAX))
    throw_invalid(function, "k",
                  "a rank's key/value block of " + std::to_string(static_cast<long long>(block_elements)) +
                      " elements is more than one MPI message can carry (INT_MAX): use more ranks");
  return problem;
}

/// The whole check: share the records (MPI_Allgather), check them, then check that every rank passes the same key
/// lengths (two MPI_Allreduce, only once every rank knows B agrees) and that they are in [0, L of the keys].
template <typename T>
RingProblem validate_ring_call(const char* function, const PrivateCommunicator& ring, SequenceLayout layout,
                               const TensorView<const T, 4>& q, const TensorView<const T, 4>& k,
                               const TensorView<const T, 4>& v, const RingGradientInputs<T>* upstream,
                               const AttentionOptions<T>& opts) {
  const RingRecord mine = make_ring_record(layout, q, k, v, upstream, opts);
  std::vector<RingRecord> records(static_cast<std::size_t>(ring.size()));
  check_mpi(MPI_Allgather(mine.data(), static_cast<int>(mine.size()), MPI_INT64_T, records.data(),
                          static_cast<int>(mine.size()), MPI_INT64_T, ring.get()),
            function, "MPI_Allgather");
  const RingProblem problem = check_ring_records(function, records, ring.rank());
  if (!opts.key_lengths.empty()) {
    std::vector<std::int64_t> lengths(opts.key_lengths.begin(), opts.key_lengths.end()), lowest(lengths.size()),
        highest(lengths.size());
    const int count = static_cast<int>(lengths.size());
    check_mpi(MPI_Allreduce(lengths.data(), lowest.data(), count, MPI_INT64_T, MPI_MIN, ring.get()), function,
              "MPI_Allreduce");
    check_mpi(MPI_Allreduce(lengths.data(), highest.data(), count, MPI_INT64_T, MPI_MAX, ring.get()), function,
              "MPI_Allreduce");
    for (std::size_t b = 0; b < lengths.size(); ++b) {
      const std::string name = "opts.key_lengths[" + std::to_string(b) + "]";
      if (lowest[b] != highest[b])
        throw_invalid(function, name,
                      "differs across ranks (from " + std::to_string(lowest[b]) + " to " + std::to_string(highest[b]) +
                          "): every rank passes the same global key lengths");
      if (lowest[b] < 0 || lowest[b] > problem.k_length)
        throw_invalid(function, name,
                      "expected a value in [0, " + std::to_string(problem.k_length) + "] (global positions), got " +
                          std::to_string(lowest[b]));
    }
  }
  return problem;
}

}  // namespace selfattn::detail

#endif  // SELFATTN_HAS_MPI
