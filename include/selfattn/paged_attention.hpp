/// \file
/// paged_attention: one decode step of many sequences of a PagedKVCache in one call (varlen: each sequence its own
/// length), on the decode kernel, with the threads spread over (sequence, key/value head, chunk of keys).
/// docs/paged_cache.md.
#pragma once

#include <selfattn/attention.hpp>
#include <selfattn/paged_cache.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace selfattn {
namespace detail {

/// The checks of a paged call, before anything is written: q against the cache and the sequences, the options a
/// paged step supports, and the outputs.
template <typename T, typename S>
void validate_paged(const char* function, const TensorView<const T, 4>& q, const PagedKVCache<T, S>& cache,
                    const std::vector<Index>& sequences, const TensorView<T, 4>& out, const TensorView<T, 3>& lse,
                    const AttentionOptions<T>& opts) {
  const Index batch = static_cast<Index>(sequences.size());
  check_shape<4>(function, "q", q.shape(), {batch, any_extent, any_extent, cache.head_dim()});
  const Index heads = q.dim(1), q_len = q.dim(2);
  if (heads < 1 || heads % cache.kv_heads() != 0)
    throw_shape_error(function, "q",
                      "the query heads (dim 1) must be a multiple of the cache's " + std::to_string(cache.kv_heads()) +
                          " key/value heads, got shape " + shape_string<4>(q.shape()));
  if (q_len > decode_max_query_rows)
    throw_shape_error(function, "q",
                      "at most " + std::to_string(decode_max_query_rows) +
                          " query rows per sequence (a decode step; a prompt attends with sdpa_forward), got shape " +
                          shape_string<4>(q.shape()));
  Index longest = 0;
  for (std::size_t b = 0; b < sequences.size(); ++b) {
    const std::string name = "sequences[" + std::to_string(b) + "]";
    if (!cache.is_live(sequences[b]))
      throw_invalid(function, name, "expected a live sequence of the cache, got " + std::to_string(sequences[b]));
    const Index length = cache.length(sequences[b]);
    if (length < q_len)
      throw_invalid(function, name,
                    "holds " + std::to_string(length) + " tokens, fewer than the " + std::to_string(q_len) +
                        " query rows (append the step's keys and values first)");
    longest = std::max(longest, length);
  }
  const auto refuse = [&](const char* option, const char* why) { throw_invalid(function, option, why); };
  if (opts.causal == Causal::top_left)
    refuse("opts.causal", "a paged step's rows are each sequence's last tokens: none or bottom_right");
  if (!opts.key_lengths.empty()) refuse("opts.key_lengths", "each sequence's length is its key length");
  if (opts.allowed.data()) refuse("opts.allowed", "not supported by a paged step (each sequence has its own keys)");
  if (opts.bias.data()) refuse("opts.bias", "not supported by a paged step (each sequence has its own keys)");
  if (opts.dropout_p != T(0)) refuse("opts.dropout_p", "not supported by a paged step (inference)");
  if (opts.need_weights) refuse("opts.need_weights", "not supported by a paged step (the decode kernel keeps none)");
  if (opts.kernel != Kernel::automatic && opts.kernel != Kernel::decode)
    refuse("opts.kernel", "a paged step runs the decode kernel: automatic or decode");
  validate_options(function, opts, batch, heads, q_len, longest);
  check_shape<4>(function, "out", out.shape(), {batch, heads, q_len, cache.value_dim()});
  check_shape<3>(function, "lse", lse.shape(), {batch, heads, q_len});
  const auto refuse_overlap = [&](const char* name, const char* other) {
    throw_invalid(function, name, std::string("overlaps ") + other + "; write into separate memory");
  };
  if (overlaps_itself(out)) refuse_overlap("out", "itself (a stride 0 or overlapping rows)");
  if (overlaps(out, q)) refuse_overlap("out", "q");
  if (overlaps(out, cache.key_pool()) || overlaps(out, cache.value_pool())) refuse_overlap("out", "the cache");
  if (overlaps(lse, q)) refuse_overlap("lse", "q");
  if (overlaps(lse, cache.key_pool()) || overlaps(lse, cache.value_pool())) refuse_overlap("lse", "the cache");
  if (overlaps(out, lse)) refuse_overlap("lse", "out");
}

}  // namespace detail

/// \brief paged_attention into caller-owned out (B, H, Lq, Dv) and lse (B, H, Lq), the kernel's scratch kept in
/// `workspace`: after a first call, calls over no more sequences and keys allocate nothing.
///
/// Throws like paged_attention, and ShapeError / std::invalid_argument naming `out` or `lse` (a wrong shape, an
/// overlap); nothing is written then.
template <typename T, typename S>
void paged_attention_into(const TensorView<const T, 4>& q, const PagedKVCache<T, S>& cache,
                          const std::vector<Index>& sequences, const TensorView<T, 4>& out, const TensorView<T, 3>& lse,
                          AttentionWorkspace<T>& workspace, const AttentionOptions<T>& opts = {}) {
  const char* fn = "paged_attention";
  detail::validate_paged(fn, q, cache, sequences, out, lse, opts);
  const Index batch = static_cast<Index>(sequences.size()), page_rows = cache.page_rows();

  // The sequences' page tables side by side (B rows of the longest table), and their lengths as key lengths.
  detail::DecodeScratch<T>& scratch = workspace.decode;
  Index table_stride = 1;
  for (const Index s : sequences) table_stride = std::max(table_stride, static_cast<Index>(cache.page_table(s).size()));
  scratch.paged_table.assign(static_cast<std::size_t>(batch * table_stride), 0);
  scratch.paged_lengths.clear();
  Index longest = 0;
  for (Index b = 0; b < batch; ++b) {
    const std::vector<std::int32_t>& pages = cache.page_table(sequences[static_cast<std::size_t>(b)]);
    std::copy(pages.begin(), pages.end(), scratch.paged_table.begin() + b * table_stride);
    scratch.paged_lengths.push_back(cache.length(sequences[static_cast<std::size_t>(b)]));
    longest = std::max(longest, scratch.paged_lengths.back());
  }
  if (batch == 0 || q.dim(1) == 0 || q.dim(2) == 0) return;

  detail::AttentionParams<T, S> p = detail::make_stored_params<T, S>(q, cache.key_pool(), cache.value_pool(), opts);
  p.k_scales = cache.key_scale_pool();
  p.v_scales = cache.value_scale_pool();
  p.pages = detail::KeyPages{scratch.paged_table.data(), table_stride, page_rows, longest};
  p.mask.k_len = longest;
  p.mask.key_lengths = scratch.paged_lengths.data();
  p.mask.diagonal_per_sequence = true;  // row i of sequence b is its token length_b - Lq + i
  detail::decode_forward(p, detail::ForwardOutputs<T>{out, lse, TensorView<T, 4>()}, scratch);
}

/// \brief One decode step of many sequences of a PagedKVCache in one call: q (B, H, Lq, D) holds the query rows of
/// the sequences `sequences[b]`, whose keys and values (this step's included: append them first) are in `cache`.
///
/// Row i of sequence b is its token length_b - Lq + i; with Causal::bottom_right it sees that sequence's keys up to
/// itself, with Causal::none (the default) all of them. window_left / window_right, ALiBi, soft-capping, sinks and
/// the scale act as in sdpa_forward, each row's diagonal being its own token. The result equals sdpa_forward of each
/// sequence over its own keys and values (read in place from the pool's pages: 16-bit ones widened, int8 ones
/// dequantised as they are read). Sequences may have any lengths and share pages; the threads share out chunks of
/// keys of every sequence alike.
///
/// Shapes: q (B, H, Lq, D) with B = sequences.size(), H a multiple of the cache's Hkv, Lq <= 16, D the cache's
/// head_dim -> out (B, H, Lq, Dv), lse (B, H, Lq).
/// Errors: ShapeError naming `q`; std::invalid_argument naming `sequences[b]` (not live, or fewer tokens than Lq) or
/// an option a paged step does not take (`opts.causal` top_left, `opts.key_lengths`, `opts.allowed`, `opts.bias`,
/// `opts.dropout_p`, `opts.need_weights`, `opts.kernel`), and what sdpa_forward says of the others.
/// \code
/// for (std::size_t b = 0; b < running.size(); ++b) cache.append(running[b], k_new[b], v_new[b]);
/// AttentionForward<float> step = paged_attention(q, cache, running);   // q (B, H, 1, D)
/// \endcode
template <typename T, typename S>
AttentionForward<T> paged_attention(const TensorView<const T, 4>& q, const PagedKVCache<T, S>& cache,
                                    const std::vector<Index>& sequences, const AttentionOptions<T>& opts = {}) {
  AttentionForward<T> result;
  result.out = Tensor<T, 4>({q.dim(0), q.dim(1), q.dim(2), cache.value_dim()});
  result.lse = Tensor<T, 3>({q.dim(0), q.dim(1), q.dim(2)});
  AttentionWorkspace<T> workspace;
  paged_attention_into(q, cache, sequences, result.out.view(), result.lse.view(), workspace, opts);
  return result;
}

/// \overload
template <typename T, typename S>
AttentionForward<T> paged_attention(const Tensor<T, 4>& q, const PagedKVCache<T, S>& cache,
                                    const std::vector<Index>& sequences, const AttentionOptions<T>& opts = {}) {
  return paged_attention(q.view(), cache, sequences, opts);
}

}  // namespace selfattn
