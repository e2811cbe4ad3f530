/// \file
/// The ring itself (selfattn/distributed.hpp): key/value blocks passed around the ranks with non-blocking
/// point-to-point calls while each rank computes on the block it holds; partial results merged by log-sum-exp
/// (forward), dk/dv blocks passed along behind their k/v blocks (backward). Runs on arguments that
/// validate_ring_call (ring_validation.hpp) has checked on every rank. Internal: include selfattn/distributed.hpp.
#pragma once

#include <selfattn/distributed/mpi_support.hpp>

#if SELFATTN_HAS_MPI || defined(SELFATTN_DOXYGEN)
#include <selfattn/attention.hpp>
#include <selfattn/detail/softmax.hpp>
#include <selfattn/distributed/ring_validation.hpp>
#include <selfattn/distributed/sequence_layout.hpp>
#include <selfattn/options.hpp>
#include <selfattn/tensor.hpp>
#include <selfattn/workspace.hpp>

#include <algorithm>
#include <limits>
#include <utility>
#include <vector>

namespace selfattn::detail {

/// Message tags on the private communicator: a k/v block, and a dk/dv block (backward).
constexpr int ring_block_tag = 1;
constexpr int ring_gradient_tag = 2;

/// One non-empty chunk of a rank's rows: its global positions, and where it starts among the rank's rows.
struct LocalChunk {
  TokenRange global;  ///< global positions [begin, end)
  Index row = 0;      ///< first local row
};

/// The non-empty chunks rank `rank` holds of a sequence of `length` tokens (one or two; none for a rank without
/// tokens), in the order of its rows.
inline std::vector<LocalChunk> local_chunks(SequenceLayout layout, Index length, int rank, int ranks) {
  std::vector<LocalChunk> chunks;
  Index row = 0;
  for (const TokenRange& range : sequence_ranges_unchecked(layout, length, rank, ranks)) {
    if (range.size() > 0) chunks.push_back({range, row});
    row += range.size();
  }
  return chunks;
}

/// Rows (dimension 2) [row, row + rows) of a (B, H, L[, W]) view.
template <typename T, int Rank>
TensorView<T, Rank> rows_of(const TensorView<T, Rank>& x, Index row, Index rows) {
  std::array<Index, Rank> shape = x.shape();
  shape[2] = rows;
  return TensorView<T, Rank>(x.data() + row * x.stride(2), shape, x.strides());
}

/// Elements of a travelling block of `tokens` keys: k (B, Hkv, tokens, D) then v (B, Hkv, tokens, Dv).
inline Index block_elements(const RingProblem& p, Index tokens) {
  return p.batch * p.kv_heads * tokens * (p.head_dim + p.value_dim);
}

/// The k and v (or dk and dv) of a block of `tokens` keys in a travelling buffer.
template <typename T>
struct BlockViews {
  TensorView<T, 4> k;  ///< (B, Hkv, tokens, D)
  TensorView<T, 4> v;  ///< (B, Hkv, tokens, Dv)
};

template <typename T>
BlockViews<T> block_views(T* buffer, const RingProblem& p, Index tokens) {
  const Index k_elements = p.batch * p.kv_heads * tokens * p.head_dim;
  return {TensorView<T, 4>(buffer, {p.batch, p.kv_heads, tokens, p.head_dim}),
          TensorView<T, 4>(buffer + k_elements, {p.batch, p.kv_heads, tokens, p.value_dim})};
}

/// to[rows to_row ..] += from (a contiguous (B, X, rows, W) view).
template <typename T>
void add_rows(const TensorView<const T, 4>& from, const TensorView<T, 4>& to, Index to_row) {
  const Index width = from.dim(3);
  if (width == 0) return;
  for (Index b = 0; b < from.dim(0); ++b)
    for (Index h = 0; h < from.dim(1); ++h)
      for (Index i = 0; i < from.dim(2); ++i) {
        const T* source = &from(b, h, i, 0);
        T* target = &to(b, h, to_row + i, 0);
        for (Index e = 0; e < width; ++e) target[e] += source[e];
      }
}

/// Merges a partial result over one key chunk into rows [row, ..) of the running (out, lse): merge.hpp's rule,
/// lse = log(e^lse_a + e^lse_b), out = e^(lse_a - lse) out_a + e^(lse_b - lse) out_b, a side with lse = -inf
/// (no allowed key) contributing nothing.
template <typename T>
void merge_into_rows(const TensorView<T, 4>& out, const TensorView<T, 3>& lse, Index row,
                     const TensorView<const T, 4>& part_out, const TensorView<const T, 3>& part_lse) {
  constexpr T none = -std::numeric_limits<T>::infinity();
  const Index value_dim = out.dim(3);
  for (Index b = 0; b < part_out.dim(0); ++b)
    for (Index h = 0; h < part_out.dim(1); ++h)
      for (Index i = 0; i < part_out.dim(2); ++i) {
        // A normalised result is a partial with maximum lse and sum 1 (0 when it saw no key): softmax.hpp's
        // merge (rule 5) and finish (rule 3), as merge_attention_partials does.
        T max = lse(b, h, row + i), sum = max == none ? T(0) : T(1);
        const T part = part_lse(b, h, i);
        const MergeWeights<T> weights = merge_partial(max, sum, part, part == none ? T(0) : T(1));
        const FinishedRow<T> finished = finish_row(max, sum);
        for (Index e = 0; e < value_dim; ++e)
          out(b, h, row + i, e) = finished.output(weights.value(out(b, h, row + i, e), part_out(b, h, i, e)));
        lse(b, h, row + i) = finished.lse;
      }
}

/// Calls run(query_chunk, key_chunk, pair_opts) for every pair of this rank's query chunks and a key block's chunks
/// that can see each other, with the pair's options: its local key lengths (a key chunk wholly padded in every
/// sequence is skipped) and its causal mask. Chunks of one layout over one sequence are equal or disjoint, so a pair
/// is on the diagonal (Causal::top_left, Lq == Lk), entirely in the past (no mask) or entirely in the future
/// (skipped).
template <typename T, typename Run>
void for_each_visible_pair(const std::vector<LocalChunk>& query_chunks, const std::vector<LocalChunk>& key_chunks,
                           const AttentionOptions<T>& opts, AttentionOptions<T>& pair_opts, Run&& run) {
  const bool causal = opts.causal != Causal::none;
  for (const LocalChunk& keys : key_chunks) {
    if (!opts.key_lengths.empty()) {
      bool any_valid = false;
      for (std::size_t b = 0; b < opts.key_lengths.size(); ++b) {
        pair_opts.key_lengths[b] = std::clamp(opts.key_lengths[b] - keys.global.begin, Index(0), keys.global.size());
        any_valid = any_valid || pair_opts.key_lengths[b] > 0;
      }
      if (!any_valid) continue;
    }
    for (const LocalChunk& queries : query_chunks) {
      if (causal && keys.global.begin > queries.global.begin) continue;
      pair_opts.causal = causal && keys.global.begin == queries.global.begin ? Causal::top_left : Causal::none;
      run(queries, keys, pair_opts);
    }
  }
}

/// The longest chunk among `chunks` (0 without any).
inline Index longest_chunk(const std::vector<LocalChunk>& chunks) {
  Index longest = 0;
  for (const LocalChunk& chunk : chunks) longest = std::max(longest, chunk.global.size());
  return longest;
}

/// The forward ring on validated arguments.
template <typename T>
AttentionForward<T> ring_forward(const char* function, const PrivateCommunicator& ring, const RingProblem& p,
                                 const TensorView<const T, 4>& q, const TensorView<const T, 4>& k,
                                 const TensorView<const T, 4>& v, const AttentionOptions<T>& opts) {
  const int right = (p.rank + 1) % p.ranks, left = (p.rank + p.ranks - 1) % p.ranks;
  const std::vector<LocalChunk> query_chunks = local_chunks(p.layout, p.q_length, p.rank, p.ranks);
  const Index rows = q.dim(2), longest = longest_chunk(query_chunks);

  // Two k/v blocks: the one computed on (and sent on), and the one arriving.
  std::vector<T> held(static_cast<std::size_t>(block_elements(p, p.max_block_keys)));
  std::vector<T> arriving(held.size());
  const BlockViews<T> own = block_views(held.data(), p, k.dim(2));
  copy_sequence_rows<T>(k, 0, own.k, 0, k.dim(2));
  copy_sequence_rows<T>(v, 0, own.v, 0, v.dim(2));

  AttentionForward<T> result;
  result.out = Tensor<T, 4>({p.batch, p.heads, rows, p.value_dim});
  result.lse = Tensor<T, 3>({p.batch, p.heads, rows});
  result.lse.fill(-std::numeric_limits<T>::infinity());  // no key seen yet: an empty partial
  std::vector<T> part_out(static_cast<std::size_t>(p.batch * p.heads * longest * p.value_dim));
  std::vector<T> part_lse(static_cast<std::size_t>(p.batch * p.heads * longest));
  AttentionWorkspace<T> workspace;
  AttentionOptions<T> pair_opts = opts;
  PendingRequests transfers;  // after the buffers: destroyed (completed) first

  for (int step = 0; step < p.ranks; ++step) {
    // At step s this rank holds the block of rank r - s and receives that of rank r - s - 1 (mod P).
    const int holder = (p.rank - step + p.ranks) % p.ranks, next_holder = (holder + p.ranks - 1) % p.ranks;
    const Index held_keys = sequence_block_length(p.layout, p.k_length, holder, p.ranks);
    if (step + 1 < p.ranks) {  // post the next block's transfer first: it travels while we compute
      const Index next_keys = sequence_block_length(p.layout, p.k_length, next_holder, p.ranks);
      transfers.receive(arriving.data(), static_cast<int>(block_elements(p, next_keys)), left, ring_block_tag,
                        ring.get(), function);
      transfers.send(held.data(), static_cast<int>(block_elements(p, held_keys)), right, ring_block_tag, ring.get(),
                     function);
    }
    const BlockViews<T> block = block_views(held.data(), p, held_keys);
    const std::vector<LocalChunk> key_chunks = local_chunks(p.layout, p.k_length, holder, p.ranks);
    for_each_visible_pair<T>(query_chunks, key_chunks, opts, pair_opts,
                             [&](const LocalChunk& queries, const LocalChunk& keys, const AttentionOptions<T>& o) {
                               const Index n = queries.global.size(), m = keys.global.size();
                               const TensorView<T, 4> out_part(part_out.data(), {p.batch, p.heads, n, p.value_dim});
                               const TensorView<T, 3> lse_part(part_lse.data(), {p.batch, p.heads, n});
                               sdpa_forward_into(rows_of(q, queries.row, n),
                                                 rows_of(TensorView<const T, 4>(block.k), keys.row, m),
                                                 rows_of(TensorView<const T, 4>(block.v), keys.row, m), out_part,
                                                 lse_part, o, workspace);
                               merge_into_rows<T>(result.out.view(), result.lse.view(), queries.row, out_part,
                                                  lse_part);
                             });
    transfers.wait_all(function);
    std::swap(held, arriving);  // swaps the vectors' storage; no element moves
  }
  return result;
}

/// The backward ring on validated arguments.
template <typename T>
AttentionGradients<T> ring_backward(const char* function, const PrivateCommunicator& ring, const RingProblem& p,
                                    const TensorView<const T, 4>& q, const TensorView<const T, 4>& k,
                                    const TensorView<const T, 4>& v, const RingGradientInputs<T>& upstream,
                                    const AttentionOptions<T>& opts) {
  const int right = (p.rank + 1) % p.ranks, left = (p.rank + p.ranks - 1) % p.ranks;
  const std::vector<LocalChunk> query_chunks = local_chunks(p.layout, p.q_length, p.rank, p.ranks);
  const Index longest = longest_chunk(query_chunks);
  const std::size_t capacity = static_cast<std::size_t>(block_elements(p, p.max_block_keys));

  // Two k/v blocks (held, arriving) as in the forward, and three dk/dv blocks: the held block's sum being formed,
  // the sum over earlier ranks arriving for it, and the previous block's sum leaving for the next rank.
  std::vector<T> held(capacity), arriving(capacity), summing(capacity), gradient_in(capacity), gradient_out(capacity);
  const BlockViews<T> own = block_views(held.data(), p, k.dim(2));
  copy_sequence_rows<T>(k, 0, own.k, 0, k.dim(2));
  copy_sequence_rows<T>(v, 0, own.v, 0, v.dim(2));

  AttentionGradients<T> grads;
  grads.dq = Tensor<T, 4>(q.shape());
  std::vector<T> part_dq(static_cast<std::size_t>(p.batch * p.heads * longest * p.head_dim));
  std::vector<T> part_dk(static_cast<std::size_t>(p.batch * p.kv_heads * p.max_block_keys * p.head_dim));
  std::vector<T> part_dv(static_cast<std::size_t>(p.batch * p.kv_heads * p.max_block_keys * p.value_dim));
  AttentionWorkspace<T> workspace;
  AttentionOptions<T> pair_opts = opts;
  PendingRequests transfers, gradient_receive, gradient_send;  // after the buffers: destroyed (completed) first

  for (int step = 0; step < p.ranks; ++step) {
    const int holder = (p.rank - step + p.ranks) % p.ranks, next_holder = (holder + p.ranks - 1) % p.ranks;
    const Index held_keys = sequence_block_length(p.layout, p.k_length, holder, p.ranks);
    const int held_elements = static_cast<int>(block_elements(p, held_keys));
    if (step + 1 < p.ranks) {
      const Index next_keys = sequence_block_length(p.layout, p.k_length, next_holder, p.ranks);
      transfers.receive(arriving.data(), static_cast<int>(block_elements(p, next_keys)), left, ring_block_tag,
                        ring.get(), function);
      transfers.send(held.data(), held_elements, right, ring_block_tag, ring.get(), function);
    }
    // The dk/dv of the held block summed over ranks r - s .. r - 1 comes from the left neighbour, which sent it
    // after its own step s - 1: it arrives while this step computes.
    if (step > 0)
      gradient_receive.receive(gradient_in.data(), held_elements, left, ring_gradient_tag, ring.get(), function);
    std::fill(summing.begin(), summing.begin() + held_elements, T(0));

    const BlockViews<T> block = block_views(held.data(), p, held_keys);
    const BlockViews<T> block_grads = block_views(summing.data(), p, held_keys);
    const std::vector<LocalChunk> key_chunks = local_chunks(p.layout, p.k_length, holder, p.ranks);
    for_each_visible_pair<T>(
        query_chunks, key_chunks, opts, pair_opts,
        [&](const LocalChunk& queries, const LocalChunk& keys, const AttentionOptions<T>& o) {
          const Index n = queries.global.size(), m = keys.global.size();
          const TensorView<T, 4> dq(part_dq.data(), {p.batch, p.heads, n, p.head_dim});
          const TensorView<T, 4> dk(part_dk.data(), {p.batch, p.kv_heads, m, p.head_dim});
          const TensorView<T, 4> dv(part_dv.data(), {p.batch, p.kv_heads, m, p.value_dim});
          // With the global out and lse, this pair's P = exp(S - lse) and D = rowsum(dout * out) are the whole
          // sequence's: its dq is this key chunk's share of the sum over keys, its dk and dv this query chunk's.
          sdpa_backward_into(rows_of(q, queries.row, n), rows_of(TensorView<const T, 4>(block.k), keys.row, m),
                             rows_of(TensorView<const T, 4>(block.v), keys.row, m),
                             rows_of(upstream.out, queries.row, n), rows_of(upstream.lse, queries.row, n),
                             rows_of(upstream.dout, queries.row, n), AttentionGradientViews<T>(dq, dk, dv), o,
                             workspace);
          add_rows<T>(dq, grads.dq.view(), queries.row);
          add_rows<T>(dk, block_grads.k, keys.row);
          add_rows<T>(dv, block_grads.v, keys.row);
        });

    if (step > 0) {
      gradient_receive.wait_all(function);
      for (int e = 0; e < held_elements; ++e)
        summing[static_cast<std::size_t>(e)] += gradient_in[static_cast<std::size_t>(e)];
    }
    if (p.ranks > 1) {  // pass the sum on; after step P - 1 that is the last hop, home to its owner r + 1
      gradient_send.wait_all(function);  // the previous sum has left: its buffer is free
      std::swap(summing, gradient_out);
      gradient_send.send(gradient_out.data(), held_elements, right, ring_gradient_tag, ring.get(), function);
    }
    transfers.wait_all(function);
    std::swap(held, arriving);
  }

  // This rank's own dk/dv, summed over every rank's queries: from the left neighbour's last step (or, alone, ours).
  const Index own_keys = k.dim(2);
  if (p.ranks > 1) {
    gradient_receive.receive(gradient_in.data(), static_cast<int>(block_elements(p, own_keys)), left,
                             ring_gradient_tag, ring.get(), function);
    gradient_receive.wait_all(function);
    gradient_send.wait_all(function);
  }
  const BlockViews<T> own_grads = block_views(p.ranks > 1 ? gradient_in.data() : summing.data(), p, own_keys);
  grads.dk = Tensor<T, 4>(TensorView<const T, 4>(own_grads.k));
  grads.dv = Tensor<T, 4>(TensorView<const T, 4>(own_grads.v));
  return grads;
}

}  // namespace selfattn::detail

#endif  // SELFATTN_HAS_MPI
