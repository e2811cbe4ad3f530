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
//   general    kernels/decode_general.inc     any mask, bias, ALiBi, dropout or soft-capping; the level's GEMM
//   grouped    kernels/decode_grouped.inc     no per-element mask and no dropout; the R = G Lq rows in SIMD lanes
//   streaming  kernels/decode_streaming.inc   the same conditions, no soft-capping, and R <= 3: vectorised over D
// The driver is kernels/decode_driver.inc. Every path runs at the instruction-set level dispatch.hpp selects
// (decode_at_level), with that level's driver.
// Which kernel (reference, fused, decode) a public call runs is attention.hpp's choice (decode_suits).
#pragma once

#include <selfattn/detail/decode_rows.hpp>
#include <selfattn/detail/decode_scratch.hpp>
#include <selfattn/detail/dispatch.hpp>
#include <selfattn/detail/kernels.hpp>
#include <selfattn/detail/params.hpp>
#include <selfattn/tensor.hpp>

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

/// Query rows per key/value head up to which the streaming path runs: R = G Lq <= 3 uses at most 3 of the
/// grouped kernel's 16 float lanes, and the step is bound by memory.
constexpr Index streaming_max_rows = 3;

/// The rule that picks the path: general with per-element masks or dropout, else streaming for R <= 3 rows per
/// key/value head (general with soft-capping: the streaming path has no per-score pass, and the general one is bound
/// by the same bytes there), else grouped. A sink needs no path of its own: it joins each row at the driver's finish.
template <typename T, typename KV>
DecodePath decode_path(const AttentionParams<T, KV>& p) {
  if (p.mask.has_element_masks() || p.dropout.active()) return DecodePath::general;
  if (p.group() * p.q_len() <= streaming_max_rows)
    return p.softcap != T(0) ? DecodePath::general : DecodePath::streaming;
  return DecodePath::grouped;
}

/// The decode kernel: the same contract as reference_forward without weights. `path` defaults to the rule's
/// choice; tests and benchmarks force each path. A fast path asked for where per-element masks or dropout rule
/// it out (or soft-capping, the streaming path) runs the general path instead: forcing a path never changes what is
/// computed. Keys and values may be stored in 16 bits (KV = bfloat16 or float16, T = float): every path reads them in
/// place and widens them exactly.
template <typename T, typename KV>
void decode_forward(const AttentionParams<T, KV>& p, const ForwardOutputs<T>& result, DecodePath path,
                    DecodeScratch<T>& scratch) {
  const bool unsupported = path == DecodePath::streaming && p.softcap != T(0);
  if (decode_path(p) == DecodePath::general || unsupported) path = DecodePath::general;
  decode_at_level(path, p, result, scratch);
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
