/// \file
/// The public scaled dot-product attention: validate everything, then run a kernel.
///
/// Dimension letters: B batch, H query heads, Hkv key/value heads (H % Hkv == 0), Lq query length,
/// Lk key length, D head dim of q and k, Dv head dim of v.
#pragma once

#include <selfattn/detail/decode.hpp>
#include <selfattn/detail/dispatch.hpp>
#include <selfattn/detail/fused_forward_bf16.hpp>
#include <selfattn/detail/params.hpp>
#include <selfattn/detail/reference.hpp>
#include <selfattn/cpu.hpp>
#include <selfattn/errors.hpp>
#include <selfattn/half_precision.hpp>
#include <selfattn/options.hpp>
#include <selfattn/tensor.hpp>
#include <selfattn/workspace.hpp>

#include <cmath>
#include <string>
#include <tuple>
#include <utility>
#include <type_traits>

namespace selfattn {

/// \brief What `sdpa_forward` returns.
///
/// Shapes: out (B, H, Lq, Dv); lse (B, H, Lq): log-sum-exp of the final scores over the allowed keys (-inf for
/// a row without any); weights (B, H, Lq, Lk), the probabilities before dropout, only when
/// `opts.need_weights`, else empty. For 16-bit inputs (T = bfloat16 or float16) out is in T, lse and weights in
/// float (compute_type_t<T>).
/// \code
/// AttentionForward<float> fwd = sdpa_forward(q, k, v, opts);
/// float row_lse = fwd.lse(0, 0, 3);   // -inf when query row 3 of batch 0, head 0 may see no key
/// \endcode
template <typename T>
struct AttentionForward {
  Tensor<T, 4> out;                      ///< (B, H, Lq, Dv): the output; 0 in a row without an allowed key
  Tensor<compute_type_t<T>, 3> lse;      ///< (B, H, Lq): log sum_j exp(s_ij) over the allowed keys; -inf for none
  Tensor<compute_type_t<T>, 4> weights;  ///< (B, H, Lq, Lk): probabilities before dropout when need_weights, else empty
};

/// \brief What `sdpa_backward` returns: gradients of a scalar loss with respect to q, k, v (their shapes),
/// when `opts.bias` is set the bias in its own (broadcast) shape, and when `opts.sinks` is set the sinks; `dbias` and
/// `dsinks` are empty otherwise.
///
/// Shapes: dq (B, H, Lq, D), dk (B, Hkv, Lk, D), dv (B, Hkv, Lk, Dv), dbias the shape of `opts.bias`, dsinks (H).
/// \code
/// AttentionGradients<float> g = sdpa_backward(q, k, v, fwd.out, fwd.lse, dout, opts);
/// \endcode
/// For 16-bit inputs dq, dk, dv are in their type and dbias in float (the bias's type).
template <typename T>
struct AttentionGradients {
  Tensor<T, 4> dq;                     ///< (B, H, Lq, D): gradient of q
  Tensor<T, 4> dk;                     ///< (B, Hkv, Lk, D): gradient of k, summed over the query heads of each group
  Tensor<T, 4> dv;                     ///< (B, Hkv, Lk, Dv): gradient of v, summed over the query heads of each group
  Tensor<compute_type_t<T>, 4> dbias;  ///< gradient of `opts.bias` in its own (broadcast) shape; empty without a bias
  Tensor<compute_type_t<T>, 1> dsinks;  ///< (H): gradient of `opts.sinks`; empty without sinks
};

/// \brief Where `sdpa_backward_into` writes the gradients: writable views (or Tensors) of the shapes of q, k and
/// v, of `opts.bias` when it is set and (H) when `opts.sinks` is (empty otherwise). dk, dv and dbias must be
/// contiguous; dq may have any strides with a contiguous last dimension.
/// \code
/// Tensor<float, 4> dq(q.shape()), dk(k.shape()), dv(v.shape());
/// sdpa_backward_into(q, k, v, out, lse, dout, {dq, dk, dv}, opts, workspace);
/// \endcode
template <typename T>
struct AttentionGradientViews {
  AttentionGradientViews() = default;
  /// dq, dk, dv and, with opts.bias, dbias, with opts.sinks, dsinks (Tensors convert to views).
  AttentionGradientViews(const TensorView<T, 4>& dq_, const TensorView<T, 4>& dk_, const TensorView<T, 4>& dv_,
                         const TensorView<T, 4>& dbias_ = {}, const TensorView<T, 1>& dsinks_ = {})
      : dq(dq_), dk(dk_), dv(dv_), dbias(dbias_), dsinks(dsinks_) {}

  TensorView<T, 4> dq;     ///< (B, H, Lq, D)
  TensorView<T, 4> dk;     ///< (B, Hkv, Lk, D), contiguous
  TensorView<T, 4> dv;     ///< (B, Hkv, Lk, Dv), contiguous
  TensorView<T, 4> dbias;  ///< the shape of opts.bias, contiguous; empty without a bias
  TensorView<T, 1> dsinks;  ///< (H) with opts.sinks; empty without sinks
};

namespace detail {

/// Validates options against the attention shape (B, H, Lq, Lk) and throws before anything is computed.
/// `function` names the public entry in the message.
template <typename T>
void validate_options(const char* function, const AttentionOptions<T>& opts, Index batch, Index heads, Index q_len,
                      Index k_len) {
  const std::array<Index, 4> scores_shape{batch, heads, q_len, k_len};
  if (!opts.key_lengths.empty()) {
    if (static_cast<Index>(opts.key_lengths.size()) != batch)
      throw_shape_error(function, "opts.key_lengths",
                        "expected " + std::to_string(batch) + " entries (one per batch), got " +
                            std::to_string(opts.key_lengths.size()));
    for (std::size_t b = 0; b < opts.key_lengths.size(); ++b)
      if (opts.key_lengths[b] < 0 || opts.key_lengths[b] > k_len)
        throw_invalid(function, "opts.key_lengths[" + std::to_string(b) + "]",
                      "expected a value in [0, " + std::to_string(k_len) + "], got " + std::to_string(opts.key_lengths[b]));
  }
  if (opts.allowed.data()) check_broadcastable(function, "opts.allowed", opts.allowed.shape(), scores_shape);
  if (opts.bias.data()) check_broadcastable(function, "opts.bias", opts.bias.shape(), scores_shape);
  if (opts.window_left < -1)
    throw_invalid(function, "opts.window_left", "expected >= -1 (-1 = unbounded), got " + std::to_string(opts.window_left));
  if (opts.window_right < -1)
    throw_invalid(function, "opts.window_right",
                  "expected >= -1 (-1 = unbounded), got " + std::to_string(opts.window_right));
  if (!opts.alibi_slopes.empty()) {
    if (static_cast<Index>(opts.alibi_slopes.size()) != heads)
      throw_shape_error(function, "opts.alibi_slopes",
                        "expected " + std::to_string(heads) + " slopes (one per query head), got " +
                            std::to_string(opts.alibi_slopes.size()));
    for (T slope : opts.alibi_slopes)
      if (!std::isfinite(slope)) throw_invalid(function, "opts.alibi_slopes", "expected finite slopes");
  }
  if (opts.scale && !std::isfinite(*opts.scale))
    throw_invalid(function, "opts.scale", "expected a finite value, got " + std::to_string(*opts.scale));
  if (!(opts.dropout_p >= T(0) && opts.dropout_p < T(1)))
    throw_invalid(function, "opts.dropout_p", "expected a value in [0, 1), got " + std::to_string(opts.dropout_p));
  if (!(opts.softcap >= T(0) && std::isfinite(opts.softcap)))
    throw_invalid(function, "opts.softcap",
                  "expected a finite value >= 0 (0 = off), got " + std::to_string(opts.softcap));
  if (!opts.sinks.empty()) {
    if (static_cast<Index>(opts.sinks.size()) != heads)
      throw_shape_error(function, "opts.sinks",
                        "expected " + std::to_string(heads) + " logits (one per query head), got " +
                            std::to_string(opts.sinks.size()));
    for (T sink : opts.sinks)
      if (std::isnan(sink) || sink == std::numeric_limits<T>::infinity())
        throw_invalid(function, "opts.sinks", "expected finite logits (or -inf: no sink), got " + std::to_string(sink));
  }
}

/// Validates the shapes of q and k: q (B, H, Lq, D), k (B, Hkv, Lk, D) with D >= 1, Hkv >= 1 and H % Hkv == 0.
inline void validate_query_key_shapes(const char* function, const std::array<Index, 4>& q,
                                      const std::array<Index, 4>& k) {
  if (q[3] < 1) throw_shape_error(function, "q", "head dim D must be >= 1, got shape " + shape_string<4>(q));
  check_shape<4>(function, "k", k, {q[0], any_extent, any_extent, q[3]});
  if (k[1] < 1 || q[1] % k[1] != 0)
    throw_shape_error(function, "k",
                      "the number of key/value heads (dim 1) must divide the " + std::to_string(q[1]) +
                          " query heads, got shape " + shape_string<4>(k));
}

/// Validates q and k: q (B, H, Lq, D), k (B, Hkv, Lk, D) with D >= 1, Hkv >= 1 and H % Hkv == 0.
template <typename T>
void validate_query_key(const char* function, const TensorView<const T, 4>& q, const TensorView<const T, 4>& k) {
  validate_query_key_shapes(function, q.shape(), k.shape());
}

/// Builds the kernel parameters from validated arguments, with keys and values stored as KV (T, or 16 bits).
/// `opts` must outlive the result (pointers).
template <typename T, typename KV>
AttentionParams<T, KV> make_stored_params(const TensorView<const T, 4>& q, const TensorView<const KV, 4>& k,
                                          const TensorView<const KV, 4>& v, const AttentionOptions<T>& opts) {
  AttentionParams<T, KV> p;
  p.q = q;
  p.k = k;
  p.v = v;
  p.scale = opts.scale ? *opts.scale : T(1) / std::sqrt(static_cast<T>(q.dim(3)));
  p.softcap = opts.softcap;
  p.sinks = opts.sinks.empty() ? nullptr : opts.sinks.data();
  p.mask.q_len = q.dim(2);
  p.mask.k_len = k.dim(2);
  p.mask.causal = opts.causal;
  p.mask.key_lengths = opts.key_lengths.empty() ? nullptr : opts.key_lengths.data();
  p.mask.window_left = opts.window_left;
  p.mask.window_right = opts.window_right;
  if (opts.allowed.data()) p.mask.allowed = Broadcast4<const bool>(opts.allowed);
  if (opts.bias.data()) p.mask.bias = Broadcast4<const T>(opts.bias);
  p.mask.alibi_slopes = opts.alibi_slopes.empty() ? nullptr : opts.alibi_slopes.data();
  p.dropout.p = opts.dropout_p;
  p.dropout.seed = opts.seed;
  return p;
}

/// Builds the kernel parameters from validated arguments. `opts` must outlive the result (pointers).
template <typename T>
AttentionParams<T> make_params(const TensorView<const T, 4>& q, const TensorView<const T, 4>& k,
                               const TensorView<const T, 4>& v, const AttentionOptions<T>& opts) {
  return make_stored_params<T, T>(q, k, v, opts);
}

/// The same call on other inputs of the same shapes (scale, masks and dropout kept).
template <typename T, typename KV>
AttentionParams<T> with_inputs(const AttentionParams<T, KV>& p, const TensorView<const T, 4>& q,
                               const TensorView<const T, 4>& k, const TensorView<const T, 4>& v) {
  AttentionParams<T> wide;
  wide.q = q;
  wide.k = k;
  wide.v = v;
  wide.scale = p.scale;
  wide.softcap = p.softcap;
  wide.sinks = p.sinks;
  wide.mask = p.mask;
  wide.dropout = p.dropout;
  return wide;
}

/// The element type of attention argument X: X's when attention takes it (float, double, bfloat16, float16),
/// else float, so that a wrong argument reaches the entry's static_asserts instead of failing to substitute.
template <typename X>
using attention_scalar_of = std::conditional_t<is_attention_element_v<scalar_of<X>>, scalar_of<X>, float>;
/// The compute type of attention argument X: the type of its options, lse, weights and workspace.
template <typename X>
using attention_compute_of = compute_type_t<attention_scalar_of<X>>;

/// The compile-time rule of every attention entry: its tensor arguments (q, k, v, and out and dout for the
/// backward) are rank-4 Tensors or TensorViews of one floating-point type. One sentence per mistake instead of a
/// failed substitution; true when the rule holds, so that the entry compiles its body only then.
template <typename... X>
constexpr bool check_attention_arguments() {
  using First = scalar_of<std::tuple_element_t<0, std::tuple<X...>>>;
  constexpr bool tensors = all_tensors<X...>;
  constexpr bool rank_4 = tensors && all_of_rank<4, X...>;
  constexpr bool one_type = rank_4 && all_hold<First, X...>;
  static_assert(tensors,
                "selfattn: q, k, v (and out, dout) must be selfattn::Tensor or TensorView; an Eigen matrix is not one "
                "(see as_view, or wrap its memory in a TensorView)");
  static_assert(!tensors || rank_4, "selfattn: q, k, v (and out, dout) must be rank 4: (batch, heads, length, head_dim)");
  static_assert(!rank_4 || one_type,
                "selfattn: q, k, v (and out, dout) must hold one element type: all float, double, bfloat16 or float16");
  static_assert(!one_type || is_attention_element_v<First>,
                "selfattn: attention runs on float, double, bfloat16 or float16 tensors");
  return one_type && is_attention_element_v<First>;
}

/// The log-sum-exp argument of sdpa_backward: a rank-3 (batch, heads, length) tensor of q's compute type (q's
/// element type; float for 16-bit q).
template <typename T, typename L>
constexpr bool check_lse_argument() {
  static_assert(is_tensor_of_rank<L, 3> && std::is_same_v<scalar_of<L>, T>,
                "selfattn: lse must be a rank-3 (batch, heads, length) Tensor or TensorView of q's compute type "
                "(q's element type; float for bfloat16 or float16 q)");
  return is_tensor_of_rank<L, 3> && std::is_same_v<scalar_of<L>, T>;
}

/// The one place that chooses the forward kernel of a call (see Kernel): the reference when the weights are
/// wanted or asked for, the decode kernel for few query rows (decode_suits), else the fused kernel.
template <typename T, typename KV>
Kernel forward_kernel(const AttentionParams<T, KV>& p, const AttentionOptions<T>& opts) {
  if (opts.need_weights || opts.kernel == Kernel::reference) return Kernel::reference;
  if (opts.kernel != Kernel::automatic) return opts.kernel;
  return decode_suits(p) ? Kernel::decode : Kernel::fused;
}

/// Runs the chosen forward kernel on validated parameters and outputs.
template <typename T>
void run_forward(const AttentionParams<T>& p, const AttentionOptions<T>& opts, const ForwardOutputs<T>& outputs,
                 AttentionWorkspace<T>& workspace) {
  switch (forward_kernel(p, opts)) {
    case Kernel::reference: reference_forward(p, outputs); break;
    case Kernel::decode: decode_forward(p, outputs, workspace.decode); break;
    default: fused_forward(p, outputs, workspace.fused); break;
  }
}

/// run_forward on keys and values stored as KV (16 bits, or int8 with block scales). With 16-bit keys and values the
/// decode kernel reads them in place
/// (the memory-bound case a 16-bit cache is for) and the fused kernel widens one tile at a time (O(tile) memory);
/// the reference kernel reads T, so it gets k and v widened once into the workspace: O(Lk D) extra memory, against
/// its O(Lq Lk) scores.
template <typename T, typename KV>
void run_forward_stored(const AttentionParams<T, KV>& p, const AttentionOptions<T>& opts,
                        const ForwardOutputs<T>& outputs, AttentionWorkspace<T>& workspace) {
  if constexpr (std::is_same_v<KV, T>) {
    run_forward(p, opts, outputs, workspace);
  } else if constexpr (std::is_same_v<KV, std::int8_t>) {
    // int8 keys and values: the decode kernel dequantises them as it reads them; the fused and reference kernels
    // get x̂ = s q dequantised once into the workspace (exactly: quantized.hpp), O(Lk D) floats as above.
    if (forward_kernel(p, opts) == Kernel::decode) {
      decode_forward(p, outputs, workspace.decode);
      return;
    }
    const TensorView<const T, 4> k = dequantize_into(p.k, p.k_scales, workspace.widened.key);
    const TensorView<const T, 4> v = dequantize_into(p.v, p.v_scales, workspace.widened.value);
    run_forward(with_inputs(p, p.q, k, v), opts, outputs, workspace);
  } else {
    const Kernel kernel = forward_kernel(p, opts);
    if (kernel == Kernel::decode) {
      decode_forward(p, outputs, workspace.decode);
      return;
    }
    if (kernel == Kernel::fused) {
      fused_forward_stored(p, outputs, workspace.fused);
      return;
    }
    const TensorView<const T, 4> k = widen_into(p.k, workspace.widened.key);
    const TensorView<const T, 4> v = widen_into(p.v, workspace.widened.value);
    run_forward(with_inputs(p, p.q, k, v), opts, outputs, workspace);
  }
}

/// run_forward with a workspace of its own, allocated for this call.
template <typename T>
void run_forward(const AttentionParams<T>& p, const AttentionOptions<T>& opts, const ForwardOutputs<T>& outputs) {
  AttentionWorkspace<T> workspace;
  run_forward(p, opts, outputs, workspace);
}

/// The checks of every forward entry on the shapes of q, k, v, and the options (whatever the element types).
template <typename T>
void validate_forward_shapes(const char* function, const std::array<Index, 4>& q, const std::array<Index, 4>& k,
                             const std::array<Index, 4>& v, const AttentionOptions<T>& opts) {
  validate_query_key_shapes(function, q, k);
  check_shape<4>(function, "v", v, {k[0], k[1], k[2], any_extent});
  validate_options(function, opts, q[0], q[1], q[2], k[2]);
}

/// The checks of every forward entry: q, k, v and the options.
template <typename T>
void validate_forward(const char* function, const TensorView<const T, 4>& q, const TensorView<const T, 4>& k,
                      const TensorView<const T, 4>& v, const AttentionOptions<T>& opts) {
  validate_forward_shapes(function, q.shape(), k.shape(), v.shape(), opts);
}

/// Throws std::invalid_argument naming `name` when a destination overlaps itself or any input of the call.
template <typename D, int Rank, typename QS, typename KS, typename T>
void check_destination(const char* function, const char* name, const TensorView<D, Rank>& destination,
                       const TensorView<const QS, 4>& q, const TensorView<const KS, 4>& k,
                       const TensorView<const KS, 4>& v, const AttentionOptions<T>& opts) {
  const auto refuse = [&](const char* other) {
    throw_invalid(function, name, std::string("overlaps ") + other + "; write into separate memory");
  };
  if (overlaps_itself(destination)) refuse("itself (a stride 0 or overlapping rows)");
  if (overlaps(destination, q)) refuse("q");
  if (overlaps(destination, k)) refuse("k");
  if (overlaps(destination, v)) refuse("v");
  if (overlaps(destination, opts.bias)) refuse("opts.bias");
  if (overlaps(destination, opts.allowed)) refuse("opts.allowed");
}

/// sdpa_forward on views of one element type: validate, allocate, run the kernel.
template <typename T>
AttentionForward<T> sdpa_forward_views(const char* function, const TensorView<const T, 4>& q,
                                       const TensorView<const T, 4>& k, const TensorView<const T, 4>& v,
                                       const AttentionOptions<T>& opts) {
  validate_forward(function, q, k, v, opts);
  AttentionForward<T> result;
  result.out = Tensor<T, 4>({q.dim(0), q.dim(1), q.dim(2), v.dim(3)});
  result.lse = Tensor<T, 3>({q.dim(0), q.dim(1), q.dim(2)});
  if (opts.need_weights) result.weights = Tensor<T, 4>({q.dim(0), q.dim(1), q.dim(2), k.dim(2)});
  run_forward(make_params(q, k, v, opts),
              opts, ForwardOutputs<T>{result.out.view(), result.lse.view(),
                                      opts.need_weights ? result.weights.view() : TensorView<T, 4>()});
  return result;
}

/// The checks of every _into forward entry: q, k, v and the options (validate_forward_shapes), no weights asked for,
/// out (B, H, Lq, Dv) and lse (B, H, Lq) of the right shapes, overlapping neither an input nor each other.
template <typename QS, typename KS, typename OS, typename T>
void validate_forward_into(const char* function, const TensorView<const QS, 4>& q, const TensorView<const KS, 4>& k,
                           const TensorView<const KS, 4>& v, const TensorView<OS, 4>& out, const TensorView<T, 3>& lse,
                           const AttentionOptions<T>& opts) {
  validate_forward_shapes(function, q.shape(), k.shape(), v.shape(), opts);
  if (opts.need_weights)
    throw_invalid(function, "opts.need_weights", "the _into form returns no weights; use sdpa_forward for them");
  check_shape<4>(function, "out", out.shape(), {q.dim(0), q.dim(1), q.dim(2), v.dim(3)});
  check_shape<3>(function, "lse", lse.shape(), {q.dim(0), q.dim(1), q.dim(2)});
  check_destination(function, "out", out, q, k, v, opts);
  check_destination(function, "lse", lse, q, k, v, opts);
  if (overlaps(out, lse)) throw_invalid(function, "lse", "overlaps out; write into separate memory");
}

/// sdpa_forward_into on views, keys and values stored as KV (T, or 16 bits: the module's step over a 16-bit cache):
/// validate (outputs included), run the kernel.
template <typename T, typename KV = T>
void sdpa_forward_into_views(const char* function, const TensorView<const T, 4>& q, const TensorView<const KV, 4>& k,
                             const TensorView<const KV, 4>& v, const TensorView<T, 4>& out,
                             const TensorView<T, 3>& lse, const AttentionOptions<T>& opts,
                             AttentionWorkspace<T>& workspace) {
  validate_forward_into(function, q, k, v, out, lse, opts);
  run_forward_stored(make_stored_params(q, k, v, opts), opts, ForwardOutputs<T>{out, lse, TensorView<T, 4>()},
                     workspace);
}

template <typename T, typename KV = T>
void sdpa_forward_into_views(const char* function, const TensorView<const T, 4>& q, const TensorView<const KV, 4>& k,
                             const TensorView<const KV, 4>& v, const TensorView<T, 4>& out,
                             const TensorView<T, 3>& lse, const AttentionOptions<T>& opts) {
  AttentionWorkspace<T> workspace;
  sdpa_forward_into_views(function, q, k, v, out, lse, opts, workspace);
}

/// The fused kernel on BF16 dot products (fused_forward_bf16.hpp) when it applies: bfloat16 q, k, v, the
/// avx512_bf16 level selected on a CPU where the products beat the FMA (bfloat16_products(), dispatch.hpp) and v
/// free of inf and NaN. Returns whether it ran.
template <typename S>
bool run_forward_bf16_dot([[maybe_unused]] const AttentionParams<float, S>& p,
                          [[maybe_unused]] const TensorView<const S, 4>& q,
                          [[maybe_unused]] const ForwardOutputs<float, S>& outputs,
                          [[maybe_unused]] AttentionWorkspace<float>& workspace) {
#if SELFATTN_BF16_DOT
  if constexpr (std::is_same_v<S, bfloat16>)
    return bfloat16_products() && isa_avx512_bf16::fused_forward_bf16(p, q, outputs, workspace.fused);
#endif
  return false;
}

/// The forward on 16-bit q, k, v (S = bfloat16 or float16) into out (S) and lse, weights (float); scores, softmax
/// and sums in float, out rounded once to S. The fused kernel reads q, k and v in place (a block of queries and a
/// tile of keys and values widened at a time, or taken as pairs by the BF16 dot products) and rounds each finished
/// row of out: it holds no float copy of any of them, so a call allocates no more than a float call does. The decode
/// kernel reads keys and values in place, q widened (few rows); the reference kernel gets everything widened once.
/// Arguments validated by the caller.
template <typename S>
void run_forward_half(const TensorView<const S, 4>& q, const TensorView<const S, 4>& k,
                      const TensorView<const S, 4>& v, const TensorView<S, 4>& out, const TensorView<float, 3>& lse,
                      const TensorView<float, 4>& weights, const AttentionOptions<float>& opts,
                      AttentionWorkspace<float>& workspace) {
  // q's shape only, no data: which kernel runs depends on shapes and options, and the fused kernel reads q itself.
  const TensorView<const float, 4> query_shape(nullptr, q.shape());
  const AttentionParams<float, S> shape_params = make_stored_params<float, S>(query_shape, k, v, opts);
  if (forward_kernel(shape_params, opts) == Kernel::fused) {
    const ForwardOutputs<float, S> outputs{out, lse, TensorView<float, 4>()};
    if (!run_forward_bf16_dot(shape_params, q, outputs, workspace))
      fused_forward_stored(shape_params, outputs, workspace.fused, q);
    return;
  }
  const TensorView<float, 4> query = widen_into(q, workspace.widened.query);
  const TensorView<float, 4> wide_out = take_buffer<float, 4>(workspace.widened.out, out.shape());
  run_forward_stored(make_stored_params<float, S>(query, k, v, opts), opts, ForwardOutputs<float>{wide_out, lse, weights},
                     workspace);
  convert_planes<float, S>(wide_out, out);
}

/// sdpa_forward on 16-bit views: validate, allocate, run.
template <typename S>
AttentionForward<S> sdpa_forward_half_views(const char* function, const TensorView<const S, 4>& q,
                                            const TensorView<const S, 4>& k, const TensorView<const S, 4>& v,
                                            const AttentionOptions<float>& opts) {
  validate_forward_shapes(function, q.shape(), k.shape(), v.shape(), opts);
  AttentionForward<S> result;
  result.out = Tensor<S, 4>({q.dim(0), q.dim(1), q.dim(2), v.dim(3)});
  result.lse = Tensor<float, 3>({q.dim(0), q.dim(1), q.dim(2)});
  if (opts.need_weights) result.weights = Tensor<float, 4>({q.dim(0), q.dim(1), q.dim(2), k.dim(2)});
  AttentionWorkspace<float> workspace;
  run_forward_half<S>(q, k, v, result.out.view(), result.lse.view(),
                      opts.need_weights ? result.weights.view() : TensorView<float, 4>(), opts, workspace);
  return result;
}

/// sdpa_forward_into on 16-bit views: validate (outputs included), run.
template <typename S>
void sdpa_forward_into_half_views(const char* function, const TensorView<const S, 4>& q,
                                  const TensorView<const S, 4>& k, const TensorView<const S, 4>& v,
                                  const TensorView<S, 4>& out, const TensorView<float, 3>& lse,
                                  const AttentionOptions<float>& opts, AttentionWorkspace<float>& workspace) {
  validate_forward_into(function, q, k, v, out, lse, opts);
  run_forward_half<S>(q, k, v, out, lse, TensorView<float, 4>(), opts, workspace);
}

/// The checks of every backward entry: q, k, v, out, lse, dout and the options.
template <typename T>
void validate_backward(const char* function, const TensorView<const T, 4>& q, const TensorView<const T, 4>& k,
                       const TensorView<const T, 4>& v, const TensorView<const T, 4>& out,
                       const TensorView<const T, 3>& lse, const TensorView<const T, 4>& dout,
                       const AttentionOptions<T>& opts) {
  validate_query_key(function, q, k);
  check_shape<4>(function, "v", v.shape(), {k.dim(0), k.dim(1), k.dim(2), any_extent});
  const std::array<Index, 4> out_shape{q.dim(0), q.dim(1), q.dim(2), v.dim(3)};
  check_shape<4>(function, "out", out.shape(), out_shape);
  check_shape<3>(function, "lse", lse.shape(), {q.dim(0), q.dim(1), q.dim(2)});
  check_shape<4>(function, "dout", dout.shape(), out_shape);
  validate_options(function, opts, q.dim(0), q.dim(1), q.dim(2), k.dim(2));
}

/// The sinks' gradient, the same for every backward kernel: a sink's probability in row i is
/// P_i = exp(sink_h - lse_i), and with no value its dP is 0, so dS = P_i (0 - D_i) with D_i = rowsum(dO_i * O_i):
///   dsink_h = -sum_{b, i} exp(sink_h - lse_bhi) D_bhi
template <typename T>
void sink_gradient(const AttentionParams<T>& p, const BackwardTensors<T>& g, const TensorView<T, 1>& dsinks) {
  for (Index h = 0; h < p.heads(); ++h) {
    const T sink = p.sink(h);
    T sum = T(0);
    for (Index b = 0; b < p.batch(); ++b)
      for (Index i = 0; i < p.q_len(); ++i) {
        const T probability =
            sink == -std::numeric_limits<T>::infinity() ? T(0) : std::exp(sink - element(g.lse, b, h, i));
        if (probability == T(0)) continue;
        const T* dout = row_pointer(g.dout, b, h, i);
        const T* out = row_pointer(g.out, b, h, i);
        T d_i = T(0);
        for (Index e = 0; e < p.value_dim(); ++e) d_i += dout[e] * out[e];
        sum += probability * d_i;
      }
    dsinks(h) = -sum;
  }
}

/// Runs the backward kernel the options choose on validated arguments, and the sinks' gradient when dsinks is given.
template <typename T>
void run_backward(const AttentionParams<T>& p, const AttentionOptions<T>& opts, const BackwardTensors<T>& tensors,
                  AttentionWorkspace<T>& workspace, const TensorView<T, 1>& dsinks = {}) {
  // Either backward accepts the out and lse of any forward: every kernel computes the same lse and out.
  if (opts.kernel == Kernel::reference)
    reference_backward(p, tensors);
  else
    fused_backward(p, tensors, workspace.backward);
  if (dsinks.data()) sink_gradient(p, tensors, dsinks);
}

/// sdpa_backward on views of one element type: validate, allocate, run the kernel.
template <typename T>
AttentionGradients<T> sdpa_backward_views(const char* function, const TensorView<const T, 4>& q,
                                          const TensorView<const T, 4>& k, const TensorView<const T, 4>& v,
                                          const TensorView<const T, 4>& out, const TensorView<const T, 3>& lse,
                                          const TensorView<const T, 4>& dout, const AttentionOptions<T>& opts) {
  validate_backward(function, q, k, v, out, lse, dout, opts);
  AttentionGradients<T> g{Tensor<T, 4>(q.shape()), Tensor<T, 4>(k.shape()), Tensor<T, 4>(v.shape()), Tensor<T, 4>(),
                          Tensor<T, 1>()};
  if (opts.bias.data()) g.dbias = Tensor<T, 4>(opts.bias.shape());
  if (!opts.sinks.empty()) g.dsinks = Tensor<T, 1>({q.dim(1)});
  const BackwardTensors<T> tensors{out, lse, dout, g.dq.view(), g.dk.view(), g.dv.view(),
                                   opts.bias.data() ? g.dbias.view() : TensorView<T, 4>()};
  AttentionWorkspace<T> workspace;
  run_backward(make_params(q, k, v, opts), opts, tensors, workspace,
               opts.sinks.empty() ? TensorView<T, 1>() : g.dsinks.view());
  return g;
}

/// sdpa_backward_into on views of one element type: validate (destinations included), run the kernel.
template <typename T>
void sdpa_backward_into_views(const char* function, const TensorView<const T, 4>& q, const TensorView<const T, 4>& k,
                              const TensorView<const T, 4>& v, const TensorView<const T, 4>& out,
                              const TensorView<const T, 3>& lse, const TensorView<const T, 4>& dout,
                              const AttentionGradientViews<T>& g, const AttentionOptions<T>& opts,
                              AttentionWorkspace<T>& workspace) {
  validate_backward(function, q, k, v, out, lse, dout, opts);
  check_shape<4>(function, "grads.dq", g.dq.shape(), q.shape());
  check_shape<4>(function, "grads.dk", g.dk.shape(), k.shape());
  check_shape<4>(function, "grads.dv", g.dv.shape(), v.shape());
  if (opts.bias.data())
    check_shape<4>(function, "grads.dbias", g.dbias.shape(), opts.bias.shape());
  else if (g.dbias.data())
    throw_invalid(function, "grads.dbias", "given without opts.bias; leave it empty");
  if (!opts.sinks.empty())
    check_shape<1>(function, "grads.dsinks", g.dsinks.shape(), {q.dim(1)});
  else if (g.dsinks.data())
    throw_invalid(function, "grads.dsinks", "given without opts.sinks; leave it empty");
  // The kernels accumulate dk, dv and dbias in place over their whole memory: they must be dense.
  const std::array<std::pair<const char*, TensorView<T, 4>>, 4> destinations{
      {{"grads.dq", g.dq}, {"grads.dk", g.dk}, {"grads.dv", g.dv}, {"grads.dbias", g.dbias}}};
  for (std::size_t n = 1; n < destinations.size(); ++n)
    if (destinations[n].second.data() && !destinations[n].second.is_contiguous())
      throw_invalid(function, destinations[n].first, "expected a contiguous tensor (it is accumulated in place)");
  for (std::size_t n = 0; n < destinations.size(); ++n) {
    const auto& [name, destination] = destinations[n];
    check_destination(function, name, destination, q, k, v, opts);
    if (overlaps(destination, out)) throw_invalid(function, name, "overlaps out; write into separate memory");
    if (overlaps(destination, lse)) throw_invalid(function, name, "overlaps lse; write into separate memory");
    if (overlaps(destination, dout)) throw_invalid(function, name, "overlaps dout; write into separate memory");
    for (std::size_t m = 0; m < n; ++m)
      if (overlaps(destination, destinations[m].second))
        throw_invalid(function, name, std::string("overlaps ") + destinations[m].first + "; write into separate memory");
    if (overlaps(destination, g.dsinks))
      throw_invalid(function, "grads.dsinks", std::string("overlaps ") + name + "; write into separate memory");
  }
  check_destination(function, "grads.dsinks", g.dsinks, q, k, v, opts);
  if (overlaps(g.dsinks, out) || overlaps(g.dsinks, lse) || overlaps(g.dsinks, dout))
    throw_invalid(function, "grads.dsinks", "overlaps out, lse or dout; write into separate memory");
  run_backward(make_params(q, k, v, opts), opts, BackwardTensors<T>{out, lse, dout, g.dq, g.dk, g.dv, g.dbias},
               workspace, g.dsinks);
}

/// sdpa_backward on 16-bit views: the float backward on the inputs widened exactly (O(L D) copies), gradients of
/// q, k, v rounded once to S; dbias stays float (the bias's type). The float entry validates.
template <typename S>
AttentionGradients<S> sdpa_backward_half_views(const char* function, const TensorView<const S, 4>& q,
                                               const TensorView<const S, 4>& k, const TensorView<const S, 4>& v,
                                               const TensorView<const S, 4>& out, const TensorView<const float, 3>& lse,
                                               const TensorView<const S, 4>& dout, const AttentionOptions<float>& opts) {
  const Tensor<float, 4> q_wide = tensor_cast<float>(q), k_wide = tensor_cast<float>(k), v_wide = tensor_cast<float>(v);
  const Tensor<float, 4> out_wide = tensor_cast<float>(out), dout_wide = tensor_cast<float>(dout);
  AttentionGradients<float> g =
      sdpa_backward_views<float>(function, q_wide.view(), k_wide.view(), v_wide.view(), out_wide.view(), lse,
                                 dout_wide.view(), opts);
  return AttentionGradients<S>{tensor_cast<S>(g.dq), tensor_cast<S>(g.dk), tensor_cast<S>(g.dv), std::move(g.dbias),
                               std::move(g.dsinks)};
}

/// attention_weights on views of one element type: validate, run the kernel that has weights with Dv = 0.
template <typename T>
Tensor<T, 4> attention_weights_views(const TensorView<const T, 4>& q, const TensorView<const T, 4>& k,
                                     const AttentionOptions<T>& opts) {
  validate_query_key("attention_weights", q, k);
  validate_options("attention_weights", opts, q.dim(0), q.dim(1), q.dim(2), k.dim(2));
  // Weights are taken before dropout and need no values: run the kernel with Dv = 0.
  const TensorView<const T, 4> no_values(nullptr, {k.dim(0), k.dim(1), k.dim(2), 0});
  AttentionOptions<T> weights_only = opts;
  weights_only.dropout_p = T(0);
  weights_only.need_weights = true;  // the dispatch then runs the one kernel that has weights
  Tensor<T, 4> out({q.dim(0), q.dim(1), q.dim(2), 0});
  Tensor<T, 3> lse({q.dim(0), q.dim(1), q.dim(2)});
  Tensor<T, 4> weights({q.dim(0), q.dim(1), q.dim(2), k.dim(2)});
  run_forward(make_params(q, k, no_values, weights_only), weights_only,
              ForwardOutputs<T>{out.view(), lse.view(), weights.view()});
  return weights;
}

}  // namespace detail

/// \brief Scaled dot-product attention: out = softmax(scale * q k^T + masks) v, with lse and optional weights.
///
/// Shapes: q (B, H, Lq, D), k (B, Hkv, Lk, D), v (B, Hkv, Lk, Dv) -> out (B, H, Lq, Dv), lse (B, H, Lq),
/// weights (B, H, Lq, Lk) when `opts.need_weights`. Query head h reads key/value head h / (H / Hkv).
/// Arguments may be any mix of `Tensor` and `TensorView` of one element type: float, double, or a 16-bit storage
/// type (bfloat16, float16), for which the scores, softmax and sums are float, out is rounded once to the inputs'
/// type, lse and weights are float, and opts is AttentionOptions<float> (docs/half_precision.md).
/// Throws ShapeError / std::invalid_argument on bad shapes or options (see docs/masks.md).
/// \code
/// Tensor<float, 4> q({1, 8, 128, 64}), k({1, 2, 128, 64}), v({1, 2, 128, 64});
/// AttentionOptions<float> opts;
/// opts.causal = Causal::top_left;
/// auto fwd = sdpa_forward(q, k, v, opts);  // fwd.out (1, 8, 128, 64), fwd.lse (1, 8, 128)
/// \endcode
template <typename Q, typename K, typename V>
AttentionForward<detail::attention_scalar_of<Q>> sdpa_forward(
    const Q& q, const K& k, const V& v, const AttentionOptions<detail::attention_compute_of<Q>>& opts = {}) {
  if constexpr (!detail::check_attention_arguments<Q, K, V>())
    return {};
  else if constexpr (is_half_width_v<detail::scalar_of<Q>>)
    return detail::sdpa_forward_half_views("sdpa_forward", detail::const_view(q), detail::const_view(k),
                                           detail::const_view(v), opts);
  else
    return detail::sdpa_forward_views("sdpa_forward", detail::const_view(q), detail::const_view(k),
                                      detail::const_view(v), opts);
}

/// \brief sdpa_forward into caller-owned outputs: no allocation of results, for loops that reuse buffers.
///
/// Shapes: q (B, H, Lq, D), k (B, Hkv, Lk, D), v (B, Hkv, Lk, Dv) -> out (B, H, Lq, Dv), lse (B, H, Lq), both
/// writable Tensors or views (any strides with a contiguous last dimension). Writes exactly what sdpa_forward
/// returns in `out` and `lse`, with the same kernel. Throws like sdpa_forward, and std::invalid_argument naming
/// `out` or `lse` when a destination overlaps an input, the other destination or itself, or naming
/// `opts.need_weights` when weights are asked for (use sdpa_forward); nothing is written on error.
/// \code
/// Tensor<float, 4> out({1, 8, 1, 64});
/// Tensor<float, 3> lse({1, 8, 1});
/// for (int step = 0; step < steps; ++step) sdpa_forward_into(q, k, v, out, lse, opts);   // no result allocated
/// \endcode
template <typename Q, typename K, typename V>
void sdpa_forward_into(const Q& q, const K& k, const V& v, const TensorView<detail::attention_scalar_of<Q>, 4>& out,
                       const TensorView<detail::attention_compute_of<Q>, 3>& lse,
                       const AttentionOptions<detail::attention_compute_of<Q>>& opts = {}) {
  AttentionWorkspace<detail::attention_compute_of<Q>> workspace;
  sdpa_forward_into(q, k, v, out, lse, opts, workspace);
}

/// \brief sdpa_forward_into with the kernels' scratch in `workspace`: after a first call of a shape, a call of
/// that shape allocates nothing at all (with the fused or decode kernel; the reference kernel allocates).
///
/// Shapes, results and errors as the overload without a workspace, which writes bitwise the same out and lse.
/// \code
/// AttentionWorkspace<float> ws;
/// for (int step = 0; step < steps; ++step) sdpa_forward_into(q, k, v, out, lse, opts, ws);  // 0 allocations
/// \endcode
template <typename Q, typename K, typename V>
void sdpa_forward_into(const Q& q, const K& k, const V& v, const TensorView<detail::attention_scalar_of<Q>, 4>& out,
                       const TensorView<detail::attention_compute_of<Q>, 3>& lse,
                       const AttentionOptions<detail::attention_compute_of<Q>>& opts,
                       AttentionWorkspace<detail::attention_compute_of<Q>>& workspace) {
  if constexpr (!detail::check_attention_arguments<Q, K, V>())
    return;
  else if constexpr (is_half_width_v<detail::scalar_of<Q>>)
    detail::sdpa_forward_into_half_views("sdpa_forward_into", detail::const_view(q), detail::const_view(k),
                                         detail::const_view(v), out, lse, opts, workspace);
  else
    detail::sdpa_forward_into_views("sdpa_forward_into", detail::const_view(q), detail::const_view(k),
                                    detail::const_view(v), out, lse, opts, workspace);
}

/// \brief Gradients of scaled dot-product attention, given the forward's `out` and `lse` for the same inputs
/// and options and the upstream gradient `dout`.
///
/// Shapes: q (B, H, Lq, D), k (B, Hkv, Lk, D), v (B, Hkv, Lk, Dv), out and dout (B, H, Lq, Dv), lse (B, H, Lq)
/// -> dq, dk, dv of the shapes of q, k, v; dbias of the shape of opts.bias when set. Key/value heads shared by
/// several query heads accumulate the gradients of the whole group. Dropout regenerates the forward's mask from
/// (opts.seed, b, h, i, j). Rows without an allowed key contribute nothing. Derivation: docs/backward.md.
/// \code
/// auto fwd = sdpa_forward(q, k, v, opts);
/// auto g = sdpa_backward(q, k, v, fwd.out, fwd.lse, dout, opts);   // g.dq, g.dk, g.dv
/// \endcode
template <typename Q, typename K, typename V, typename O, typename L, typename DO>
AttentionGradients<detail::attention_scalar_of<Q>> sdpa_backward(
    const Q& q, const K& k, const V& v, const O& out, const L& lse, const DO& dout,
    const AttentionOptions<detail::attention_compute_of<Q>>& opts = {}) {
  if constexpr (!(detail::check_attention_arguments<Q, K, V, O, DO>() &&
                  detail::check_lse_argument<detail::attention_compute_of<Q>, L>()))
    return {};
  else if constexpr (is_half_width_v<detail::scalar_of<Q>>)
    return detail::sdpa_backward_half_views("sdpa_backward", detail::const_view(q), detail::const_view(k),
                                            detail::const_view(v), detail::const_view(out), detail::const_view(lse),
                                            detail::const_view(dout), opts);
  else
    return detail::sdpa_backward_views("sdpa_backward", detail::const_view(q), detail::const_view(k),
                                       detail::const_view(v), detail::const_view(out), detail::const_view(lse),
                                       detail::const_view(dout), opts);
}

/// \brief sdpa_backward into caller-owned gradients, with the kernels' scratch in `workspace`: after a first call of
/// a shape, a call of that shape allocates nothing (with the fused backward; `Kernel::reference` allocates).
///
/// Shapes: as sdpa_backward; `grads` holds dq (B, H, Lq, D), dk (B, Hkv, Lk, D), dv (B, Hkv, Lk, Dv) and dbias
/// (the shape of opts.bias, or empty without one), dk, dv and dbias contiguous. Writes bitwise what sdpa_backward
/// returns. Throws like sdpa_backward, ShapeError naming `grads.dq` (etc.) for a wrong shape, and
/// std::invalid_argument naming the gradient when it overlaps an input (q, k, v, out, lse, dout, the options'
/// tensors), another gradient or itself, is not contiguous where required, or is a dbias without opts.bias;
/// nothing is written on error.
/// \code
/// AttentionWorkspace<float> ws;
/// Tensor<float, 4> dq(q.shape()), dk(k.shape()), dv(v.shape());
/// sdpa_backward_into(q, k, v, fwd.out, fwd.lse, dout, {dq, dk, dv}, opts, ws);
/// \endcode
template <typename Q, typename K, typename V, typename O, typename L, typename DO>
void sdpa_backward_into(const Q& q, const K& k, const V& v, const O& out, const L& lse, const DO& dout,
                        const AttentionGradientViews<detail::float_scalar_of<Q>>& grads,
                        const AttentionOptions<detail::float_scalar_of<Q>>& opts,
                        AttentionWorkspace<detail::float_scalar_of<Q>>& workspace) {
  static_assert(!is_half_width_v<detail::scalar_of<Q>>,
                "selfattn: sdpa_backward_into takes float or double tensors; for bfloat16 or float16 use sdpa_backward");
  if constexpr (detail::check_attention_arguments<Q, K, V, O, DO>() &&
                detail::check_lse_argument<detail::scalar_of<Q>, L>())
    detail::sdpa_backward_into_views("sdpa_backward_into", detail::const_view(q), detail::const_view(k),
                                     detail::const_view(v), detail::const_view(out), detail::const_view(lse),
                                     detail::const_view(dout), grads, opts, workspace);
}

/// \brief sdpa_backward_into with a workspace of its own, allocated for the call (the same results).
template <typename Q, typename K, typename V, typename O, typename L, typename DO>
void sdpa_backward_into(const Q& q, const K& k, const V& v, const O& out, const L& lse, const DO& dout,
                        const AttentionGradientViews<detail::float_scalar_of<Q>>& grads,
                        const AttentionOptions<detail::float_scalar_of<Q>>& opts = {}) {
  AttentionWorkspace<detail::float_scalar_of<Q>> workspace;
  sdpa_backward_into(q, k, v, out, lse, dout, grads, opts, workspace);
}

/// \brief The attention output only: (B, H, Lq, Dv). No weights are returned; `opts.need_weights` only keeps
/// the kernel choice of `sdpa_forward` with the same options (the reference kernel), so that the result equals
/// `sdpa_forward(q, k, v, opts).out` bit for bit.
///
/// Shapes: q (B, H, Lq, D), k (B, Hkv, Lk, D), v (B, Hkv, Lk, Dv) -> (B, H, Lq, Dv). Throws like sdpa_forward.
/// \code
/// Tensor<double, 4> o = scaled_dot_product_attention(q, k, v);
/// \endcode
template <typename Q, typename K, typename V>
Tensor<detail::attention_scalar_of<Q>, 4> scaled_dot_product_attention(
    const Q& q, const K& k, const V& v, const AttentionOptions<detail::attention_compute_of<Q>>& opts = {}) {
  if constexpr (detail::check_attention_arguments<Q, K, V>()) {
    AttentionOptions<detail::attention_compute_of<Q>> without_weights = opts;
    without_weights.need_weights = false;
    if (opts.need_weights) without_weights.kernel = Kernel::reference;  // the kernel sdpa_forward(opts) runs
    const char* function = "scaled_dot_product_attention";
    if constexpr (is_half_width_v<detail::scalar_of<Q>>)
      return detail::sdpa_forward_half_views(function, detail::const_view(q), detail::const_view(k),
                                             detail::const_view(v), without_weights)
          .out;
    else
      return detail::sdpa_forward_views(function, detail::const_view(q), detail::const_view(k), detail::const_view(v),
                                        without_weights)
          .out;
  } else {
    return {};
  }
}

/// \brief The attention probabilities (B, H, Lq, Lk) for q (B, H, Lq, D) and k (B, Hkv, Lk, D), before
/// dropout; masked entries are exactly 0, and a row without any allowed key is all 0.
///
/// Shapes: q (B, H, Lq, D), k (B, Hkv, Lk, D) -> (B, H, Lq, Lk). Throws like sdpa_forward (no v to check).
/// \code
/// Tensor<float, 4> p = attention_weights(q, k, opts);  // each row sums to 1 (or is all 0)
/// \endcode
template <typename Q, typename K>
Tensor<detail::attention_compute_of<Q>, 4> attention_weights(const Q& q, const K& k,
                                                             const AttentionOptions<detail::attention_compute_of<Q>>& opts = {}) {
  if constexpr (!detail::check_attention_arguments<Q, K>())
    return {};
  else if constexpr (is_half_width_v<detail::scalar_of<Q>>)  // probabilities in float from the widened inputs
    return detail::attention_weights_views<float>(tensor_cast<float>(q).view(), tensor_cast<float>(k).view(), opts);
  else
    return detail::attention_weights_views(detail::const_view(q), detail::const_view(k), opts);
}

}  // namespace selfattn
