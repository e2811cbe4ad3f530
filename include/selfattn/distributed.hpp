/// \file
/// Ring attention (sequence parallelism) over MPI: scaled dot-product attention, forward and backward, over a
/// sequence split across the ranks of a communicator, each rank holding the queries, keys and values of its own
/// tokens. Optional: the umbrella selfattn/selfattn.hpp does not include it. It needs an MPI implementation's
/// `<mpi.h>` (Debian: libopenmpi-dev openmpi-bin; CMake: `find_package(MPI COMPONENTS CXX)`, link `MPI::MPI_CXX`;
/// the selfattn target does not link MPI). Without `<mpi.h>` on the include path this header defines
/// `SELFATTN_HAS_MPI` as 0 and nothing else.
///
/// Dimension letters: B batch, H query heads, Hkv key/value heads (H % Hkv == 0), D head dim of q and k, Dv head
/// dim of v; L the whole sequence's length, P the number of ranks, L_r the tokens rank r holds
/// (sequence_block_length: L / P or one more; zigzag: two chunks of L / 2P or one more).
///
/// The algorithm (Ring Attention, Liu et al. 2023). Rank r holds q (B, H, L_r, D), k (B, Hkv, L_r, D) and
/// v (B, Hkv, L_r, Dv) of its tokens (layouts: sequence_layout.hpp). The key/value blocks travel around the ring
/// r -> r + 1: at step s = 0 .. P - 1 rank r holds the block of rank r - s (mod P). It posts MPI_Isend of that block
/// to r + 1 and MPI_Irecv of the next from r - 1, then attends its queries to the block it holds while they travel
/// (communication overlapped with compute), and merges the result into its running (out, lse) by log-sum-exp
/// (merge_attention_partials' rule, merge.hpp): after P steps every query has seen every key, and the result is
/// sdpa_forward's on the whole sequence, up to rounding.
///
/// Masks, in global positions, give exactly the single-process result:
/// - `opts.causal`: query at position i sees keys at positions j <= i (top_left and bottom_right agree: q and k
///   are one sequence). Within a layout the chunks of queries and keys coincide, so a (query chunk, key chunk)
///   pair is either on the diagonal (run with a top_left mask), entirely in the past (no mask) or entirely in the
///   future (skipped, not computed). Under `zigzag` every rank then does the same work.
/// - `opts.key_lengths`: B global lengths, the same on every rank; each key block gets its local lengths, and a
///   block wholly padded for every sequence is skipped. A row without any allowed key gives out 0 and lse -inf.
/// - GQA (Hkv < H) and `opts.scale` (default 1 / sqrt(D)) as in sdpa_forward; `opts.kernel` chooses the kernel of
///   each block.
/// - Not supported (std::invalid_argument naming the option): `dropout_p` > 0, `alibi_slopes`, `bias`, `allowed`,
///   `window_left` / `window_right` and `need_weights`: they are defined over the whole sequence, which no rank has.
///
/// The backward: each rank keeps its q, out, lse and dout, and dq accumulates locally. The k/v blocks travel as in
/// the forward, and the dk/dv of each block travels with it one step behind: rank r adds its contribution and sends
/// the sum on to r + 1, so after a last hop home every rank ends with the gradients of its own k and v. Each block's
/// part is sdpa_backward(q, k_block, v_block, out, lse, dout) with the global out and lse: its probabilities
/// P = exp(S - lse) and D = rowsum(dout * out) are then those of the whole sequence, so dq = sum over blocks and
/// dk, dv of a block = sum over query blocks are exact sums.
///
/// Memory per rank (elements; T = float or double): its q, k, v, out, lse (and dout, dq, dk, dv); two k/v blocks
/// in flight, 2 B Hkv L_r (D + Dv); the scratch of one chunk pair and the kernels' workspace. The backward adds
/// three dk/dv blocks (one being summed, one arriving, one leaving), 3 B Hkv L_r (D + Dv).
///
/// Communication per rank and call: the forward sends and receives one k/v block per step for P - 1 steps,
/// B Hkv L_r (D + Dv) elements each: (P - 1) / P B Hkv L (D + Dv) in all, about the whole K and V once whatever
/// P. The backward sends P - 1 k/v blocks and P dk/dv blocks: (2P - 1) / P B Hkv L (D + Dv). Each step computes
/// about 2 B H L_r^2 (D + Dv) flops against B Hkv L_r (D + Dv) elements moved, so the transfers hide behind the
/// compute once L_r (H / Hkv) is large enough for the network. Before any of it, one MPI_Allgather of a record of
/// 37 integers per rank (and two MPI_Allreduce of B integers with key lengths) checks every rank's arguments.
///
/// Errors: before any ring traffic every rank shares its shapes and options, and all ranks validate them together,
/// so a mismatch on one rank throws the same ShapeError or std::invalid_argument on every rank, naming the rank,
/// the argument, the expected and the actual shape, never a hang. An MPI error code becomes MpiError. The calls
/// are collective: every rank of `comm` must make the same call. They use a private duplicate of `comm`, whose
/// pending messages they never touch.
#pragma once

#include <selfattn/distributed/mpi_support.hpp>
#include <selfattn/distributed/sequence_layout.hpp>

#if SELFATTN_HAS_MPI || defined(SELFATTN_DOXYGEN)
#include <selfattn/distributed/ring.hpp>
#include <selfattn/distributed/ring_validation.hpp>

namespace selfattn {

/// \brief Ring attention forward over the ranks of `comm`: this rank's rows of sdpa_forward on the whole sequence.
///
/// Shapes (this rank's block, L_r = sequence_block_length(layout, L, rank, P)): q (B, H, L_r, D),
/// k (B, Hkv, L_r, D), v (B, Hkv, L_r, Dv) -> out (B, H, L_r, Dv), lse (B, H, L_r); `weights` stays empty. L is
/// the sum of the ranks' lengths (without a causal mask the query and key sequences may differ in length: each
/// is split by `layout`). Any mix of Tensor and TensorView of one element type, float or double. Collective.
/// Throws, identically on every rank, ShapeError / std::invalid_argument naming the rank and argument, or for an
/// option it does not support (see the file comment); MpiError when MPI fails; std::logic_error outside
/// MPI_Init .. MPI_Finalize.
/// \code
/// int rank = 0, ranks = 1;
/// MPI_Comm_rank(MPI_COMM_WORLD, &rank);
/// MPI_Comm_size(MPI_COMM_WORLD, &ranks);
/// const SequenceLayout layout = SequenceLayout::zigzag;   // equal causal work per rank
/// Tensor<float, 4> q = sequence_block(q_all, layout, rank, ranks), k = sequence_block(k_all, layout, rank, ranks),
///                  v = sequence_block(v_all, layout, rank, ranks);
/// AttentionOptions<float> opts;
/// opts.causal = Causal::top_left;
/// AttentionForward<float> fwd = ring_attention_forward(MPI_COMM_WORLD, layout, q, k, v, opts);
/// // fwd.out == sequence_block(sdpa_forward(q_all, k_all, v_all, opts).out, layout, rank, ranks), up to rounding
/// \endcode
template <typename Q, typename K, typename V>
AttentionForward<detail::float_scalar_of<Q>> ring_attention_forward(
    MPI_Comm comm, SequenceLayout layout, const Q& q, const K& k, const V& v,
    const AttentionOptions<detail::float_scalar_of<Q>>& opts = {}) {
  if constexpr (detail::check_attention_arguments<Q, K, V>()) {
    using T = detail::scalar_of<Q>;
    constexpr const char* function = "ring_attention_forward";
    detail::check_mpi_running(function);
    if (comm == MPI_COMM_NULL) detail::throw_invalid(function, "comm", "is MPI_COMM_NULL");
    const detail::PrivateCommunicator ring(comm, function);
    const TensorView<const T, 4> q_view = detail::const_view(q), k_view = detail::const_view(k),
                                 v_view = detail::const_view(v);
    const detail::RingProblem problem =
        detail::validate_ring_call<T>(function, ring, layout, q_view, k_view, v_view, nullptr, opts);
    return detail::ring_forward<T>(function, ring, problem, q_view, k_view, v_view, opts);
  } else {
    return {};
  }
}

/// \brief Ring attention backward over the ranks of `comm`: the gradients of this rank's q, k and v, given its
/// rows of the forward's out and lse (from ring_attention_forward, or any forward of the same inputs) and of dout.
///
/// Shapes (this rank's block): q (B, H, L_r, D), k (B, Hkv, L_r, D), v (B, Hkv, L_r, Dv), out and dout
/// (B, H, L_r, Dv), lse (B, H, L_r) -> dq, dk, dv of the shapes of q, k, v; `dbias` stays empty. Equals this
/// rank's rows of sdpa_backward on the whole sequence, up to rounding; dk and dv sum over every rank's queries.
/// Collective; throws like ring_attention_forward (also for out, lse, dout of wrong shapes).
/// \code
/// AttentionForward<float> fwd = ring_attention_forward(MPI_COMM_WORLD, layout, q, k, v, opts);
/// AttentionGradients<float> g =
///     ring_attention_backward(MPI_COMM_WORLD, layout, q, k, v, fwd.out, fwd.lse, dout, opts);   // g.dq, g.dk, g.dv
/// \endcode
template <typename Q, typename K, typename V, typename O, typename L, typename DO>
AttentionGradients<detail::float_scalar_of<Q>> ring_attention_backward(
    MPI_Comm comm, SequenceLayout layout, const Q& q, const K& k, const V& v, const O& out, const L& lse,
    const DO& dout, const AttentionOptions<detail::float_scalar_of<Q>>& opts = {}) {
  if constexpr (detail::check_attention_arguments<Q, K, V, O, DO>() &&
                detail::check_lse_argument<detail::scalar_of<Q>, L>()) {
    using T = detail::scalar_of<Q>;
    constexpr const char* function = "ring_attention_backward";
    detail::check_mpi_running(function);
    if (comm == MPI_COMM_NULL) detail::throw_invalid(function, "comm", "is MPI_COMM_NULL");
    const detail::PrivateCommunicator ring(comm, function);
    const TensorView<const T, 4> q_view = detail::const_view(q), k_view = detail::const_view(k),
                                 v_view = detail::const_view(v);
    const detail::RingGradientInputs<T> upstream{detail::const_view(out), detail::const_view(lse),
                                                 detail::const_view(dout)};
    const detail::RingProblem problem =
        detail::validate_ring_call<T>(function, ring, layout, q_view, k_view, v_view, &upstream, opts);
    return detail::ring_backward<T>(function, ring, problem, q_view, k_view, v_view, upstream, opts);
  } else {
    return {};
  }
}

}  // namespace selfattn

#endif  // SELFATTN_HAS_MPI
