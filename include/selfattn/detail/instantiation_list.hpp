/// \file
/// The list of explicit instantiations behind <selfattn/extern_templates.hpp> and <selfattn/instantiate.hpp>: the
/// templates, most of them internal, that do the work behind the public functions and modules, by signature. An
/// internal signature changes here, not in a header users read. Two macros, one list each, expanded inside namespace
/// selfattn: `extern template` in extern_templates.hpp (declarations), `template` in instantiate.hpp (definitions), so
/// the two cannot drift apart.
#pragma once

#include <selfattn/attention.hpp>
#include <selfattn/nn/activation.hpp>
#include <selfattn/nn/feed_forward.hpp>
#include <selfattn/nn/kv_cache.hpp>
#include <selfattn/nn/module_workspace.hpp>
#include <selfattn/nn/multihead.hpp>
#include <selfattn/nn/norm.hpp>
#include <selfattn/nn/transformer_decoder_layer.hpp>
#include <selfattn/nn/transformer_decoder_stack.hpp>
#include <selfattn/nn/transformer_layer.hpp>
#include <selfattn/nn/transformer_stack.hpp>
#include <selfattn/projection.hpp>

#include <array>
#include <cstdint>
#include <vector>

/// \cond SELFATTN_INTERNAL
// The explicit instantiations of one element type T, behind KEYWORD.
#define SELFATTN_DETAIL_EXPLICIT_INSTANTIATIONS(KEYWORD, T)                                                            \
  KEYWORD AttentionForward<T> detail::sdpa_forward_views<T>(                                                           \
      const char*, const TensorView<const T, 4>&, const TensorView<const T, 4>&, const TensorView<const T, 4>&,        \
      const AttentionOptions<T>&);                                                                                     \
  KEYWORD void detail::sdpa_forward_into_views<T>(                                                                     \
      const char*, const TensorView<const T, 4>&, const TensorView<const T, 4>&, const TensorView<const T, 4>&,        \
      const TensorView<T, 4>&, const TensorView<T, 3>&, const AttentionOptions<T>&);                                   \
  KEYWORD void detail::sdpa_forward_into_views<T>(                                                                     \
      const char*, const TensorView<const T, 4>&, const TensorView<const T, 4>&, const TensorView<const T, 4>&,        \
      const TensorView<T, 4>&, const TensorView<T, 3>&, const AttentionOptions<T>&, AttentionWorkspace<T>&);           \
  KEYWORD void detail::sdpa_backward_into_views<T>(                                                                    \
      const char*, const TensorView<const T, 4>&, const TensorView<const T, 4>&, const TensorView<const T, 4>&,        \
      const TensorView<const T, 4>&, const TensorView<const T, 3>&, const TensorView<const T, 4>&,                     \
      const AttentionGradientViews<T>&, const AttentionOptions<T>&, AttentionWorkspace<T>&);                           \
  KEYWORD AttentionGradients<T> detail::sdpa_backward_views<T>(                                                        \
      const char*, const TensorView<const T, 4>&, const TensorView<const T, 4>&, const TensorView<const T, 4>&,        \
      const TensorView<const T, 4>&, const TensorView<const T, 3>&, const TensorView<const T, 4>&,                     \
      const AttentionOptions<T>&);                                                                                     \
  KEYWORD Tensor<T, 4> detail::attention_weights_views<T>(const TensorView<const T, 4>&,                               \
                                                          const TensorView<const T, 4>&, const AttentionOptions<T>&);  \
  KEYWORD void detail::run_forward<T>(const detail::AttentionParams<T>&, const AttentionOptions<T>&,                   \
                                      const detail::ForwardOutputs<T>&);                                               \
  KEYWORD void detail::run_forward<T>(const detail::AttentionParams<T>&, const AttentionOptions<T>&,                   \
                                      const detail::ForwardOutputs<T>&, AttentionWorkspace<T>&);                       \
  KEYWORD void detail::reference_forward<T>(const detail::AttentionParams<T>&, const detail::ForwardOutputs<T>&);      \
  KEYWORD void detail::reference_backward<T>(const detail::AttentionParams<T>&, const detail::BackwardTensors<T>&);    \
  KEYWORD void detail::fused_forward<T>(const detail::AttentionParams<T>&, const detail::ForwardOutputs<T>&,           \
                                        detail::FusedForwardScratch<T>&);                                              \
  KEYWORD void detail::fused_forward<T>(const detail::AttentionParams<T>&, const detail::ForwardOutputs<T>&);          \
  KEYWORD void detail::fused_backward<T>(const detail::AttentionParams<T>&, const detail::BackwardTensors<T>&,         \
                                         detail::FusedBackwardScratch<T>&);                                            \
  KEYWORD void detail::fused_backward<T>(const detail::AttentionParams<T>&, const detail::BackwardTensors<T>&);        \
  KEYWORD void detail::decode_forward<T>(const detail::AttentionParams<T>&, const detail::ForwardOutputs<T>&,          \
                                         detail::DecodePath, detail::DecodeScratch<T>&);                               \
  KEYWORD void detail::decode_forward<T>(const detail::AttentionParams<T>&, const detail::ForwardOutputs<T>&,          \
                                         detail::DecodePath);                                                          \
  KEYWORD void detail::decode_forward<T>(const detail::AttentionParams<T>&, const detail::ForwardOutputs<T>&,          \
                                         detail::DecodeScratch<T>&);                                                   \
  KEYWORD void detail::decode_forward<T>(const detail::AttentionParams<T>&, const detail::ForwardOutputs<T>&);         \
  KEYWORD void detail::linear_into<T>(const TensorView<const T, 3>&, const TensorView<const T, 2>&,                    \
                                      const TensorView<const T, 1>&, const TensorView<T, 3>&);                         \
  KEYWORD void detail::linear_into_stored<T, T>(const TensorView<const T, 3>&, const TensorView<const T, 2>&,          \
                                                const TensorView<const T, 1>&, const TensorView<T, 3>&,                \
                                                detail::StackedProjection<T>&);                                        \
  KEYWORD Tensor<T, 3> detail::fused_qkv_projection<T>(const TensorView<const T, 3>&,                                  \
                                                       const std::array<TensorView<const T, 2>, 3>&,                   \
                                                       const std::array<TensorView<const T, 1>, 3>&);                  \
  KEYWORD void detail::fused_qkv_projection_into<T, T>(                                                                \
      const TensorView<const T, 3>&, const std::array<TensorView<const T, 2>, 3>&,                                     \
      const std::array<TensorView<const T, 1>, 3>&, const TensorView<T, 3>&, detail::StackedProjection<T>&);           \
  KEYWORD LinearGradients<T> linear_backward<T>(const TensorView<const T, 3>&, const TensorView<const T, 2>&,          \
                                                const TensorView<const T, 3>&, bool);                                  \
  KEYWORD class MultiHeadAttention<T>;                                                                                 \
  KEYWORD void MultiHeadAttention<T>::checked_step<T, T, T>(                                                           \
      const MhaParams<T>&, const char*, const TensorView<const T, 3>&, KVCache<T, T>&, const TensorView<T, 3>&,        \
      MhaWorkspace<T>&, const AttentionOptions<T>&, const std::vector<Index>&) const;                                  \
  KEYWORD void MultiHeadAttention<T>::step_walk<T, T>(const MhaParams<T>&, const TensorView<const T, 3>&,              \
                                                      KVCache<T, T>&, const AttentionOptions<T>&,                      \
                                                      const TensorView<T, 3>&, MhaWorkspace<T>&) const;                \
  KEYWORD void MultiHeadAttention<T>::forward_into_walk<T>(                                                            \
      const MhaParams<T>&, const TensorView<const T, 3>&, const TensorView<const T, 3>&,                               \
      const TensorView<const T, 3>&, const TensorView<T, 3>&, MhaWorkspace<T>&, const AttentionOptions<T>&) const;     \
  KEYWORD void detail::norm_forward_into<T>(NormKind, T, const TensorView<const T, 3>&, const TensorView<const T, 1>&, \
                                            const TensorView<const T, 1>&, const TensorView<T, 3>&,                    \
                                            detail::NormStatistics<T>&);                                               \
  KEYWORD void detail::norm_backward_into<T>(                                                                          \
      NormKind, const TensorView<const T, 3>&, const detail::NormStatistics<T>&, const TensorView<const T, 1>&,        \
      const TensorView<const T, 3>&, const TensorView<T, 3>&, const TensorView<T, 1>&, const TensorView<T, 1>&);       \
  KEYWORD void detail::activation_forward<T>(Activation, const TensorView<const T, 3>&, const TensorView<T, 3>&);      \
  KEYWORD void detail::activation_backward<T>(Activation, const TensorView<const T, 3>&,                               \
                                              const TensorView<const T, 3>&, const TensorView<T, 3>&);                 \
  KEYWORD void detail::feed_forward_forward<T>(Activation, T, std::uint64_t, const TensorView<const T, 3>&,            \
                                               const detail::FeedForwardWeights<T>&, detail::FeedForwardSaved<T>&,     \
                                               const TensorView<T, 3>&);                                               \
  KEYWORD Tensor<T, 3> detail::feed_forward_backward<T>(                                                               \
      Activation, T, std::uint64_t, const TensorView<const T, 3>&, const detail::FeedForwardWeights<T>&,               \
      const detail::FeedForwardSaved<T>&, const TensorView<const T, 3>&, bool, FeedForwardParams<T>&);                 \
  KEYWORD class detail::Normalization<T>;                                                                              \
  KEYWORD class FeedForward<T>;                                                                                        \
  KEYWORD class TransformerLayer<T>;                                                                                   \
  KEYWORD Tensor<T, 3> TransformerLayer<T>::run_step<T, T>(                                                            \
      const TransformerLayerParams<T>&, const TensorView<const T, 3>&, KVCache<T, T>&, const AttentionOptions<T>&,     \
      const std::vector<Index>&) const;                                                                                \
  KEYWORD class TransformerDecoderLayer<T>;                                                                            \
  KEYWORD class TransformerStack<T>

// The forward and the decode kernel on keys and values stored as KV (bfloat16, float16, int8 with block scales;
// computed in float): a 16-bit or int8 KV cache.
#define SELFATTN_DETAIL_STORED_KV_INSTANTIATIONS(KEYWORD, KV)                                                          \
  KEYWORD void detail::run_forward_stored<float, KV>(                                                                  \
      const detail::AttentionParams<float, KV>&, const AttentionOptions<float>&, const detail::ForwardOutputs<float>&, \
      AttentionWorkspace<float>&);                                                                                     \
  KEYWORD void detail::decode_forward<float, KV>(const detail::AttentionParams<float, KV>&,                            \
                                                 const detail::ForwardOutputs<float>&, detail::DecodePath,             \
                                                 detail::DecodeScratch<float>&);                                       \
  KEYWORD void detail::decode_forward<float, KV>(const detail::AttentionParams<float, KV>&,                            \
                                                 const detail::ForwardOutputs<float>&, detail::DecodePath);            \
  KEYWORD void detail::decode_forward<float, KV>(const detail::AttentionParams<float, KV>&,                            \
                                                 const detail::ForwardOutputs<float>&, detail::DecodeScratch<float>&); \
  KEYWORD void detail::decode_forward<float, KV>(const detail::AttentionParams<float, KV>&,                            \
                                                 const detail::ForwardOutputs<float>&)

// The kernels on 16-bit storage (S = bfloat16, float16; computed in float): the forward on 16-bit q, k, v, the
// forward and decode on 16-bit keys and values (a 16-bit KV cache), and the projections by 16-bit weights. Each
// compiles every dispatch level's kernels for S: most of a 16-bit caller's compile time without these.
#define SELFATTN_DETAIL_SIXTEEN_BIT_INSTANTIATIONS(KEYWORD, S)                                                        \
  KEYWORD void detail::run_forward_half<S>(const TensorView<const S, 4>&, const TensorView<const S, 4>&,              \
                                           const TensorView<const S, 4>&, const TensorView<S, 4>&,                    \
                                           const TensorView<float, 3>&, const TensorView<float, 4>&,                  \
                                           const AttentionOptions<float>&, AttentionWorkspace<float>&);               \
  SELFATTN_DETAIL_STORED_KV_INSTANTIATIONS(KEYWORD, S);                                                               \
  KEYWORD void detail::linear_into_stored<float, S>(const TensorView<const float, 3>&, const TensorView<const S, 2>&, \
                                                    const TensorView<const S, 1>&, const TensorView<float, 3>&,       \
                                                    detail::StackedProjection<float>&);                               \
  KEYWORD void detail::fused_qkv_projection_into<float, S>(                                                           \
      const TensorView<const float, 3>&, const std::array<TensorView<const S, 2>, 3>&,                                \
      const std::array<TensorView<const S, 1>, 3>&, const TensorView<float, 3>&, detail::StackedProjection<float>&)
// The float kernels of one dispatch level (LEVEL: detail, the generic level; detail::isa_avx2; detail::isa_avx512),
// which dispatch.hpp's entries above call: the fused forward and backward, the decode kernel's paths (keys and values
// of float, 16 bits or int8) and the projection of a few rows. A caller that names a level itself compiles them again
// without these: tests/dispatch_test.cpp, which runs every level in one process, took 69 CPU s at g++ -O2, 8 with them.
#define SELFATTN_DETAIL_LEVEL_DECODE(KEYWORD, LEVEL, KV)                                                        \
  KEYWORD void LEVEL::run_decode_path<float, KV>(detail::DecodePath, const detail::AttentionParams<float, KV>&, \
                                                 const detail::ForwardOutputs<float>&, detail::DecodeScratch<float>&)
#define SELFATTN_DETAIL_LEVEL_INSTANTIATIONS(KEYWORD, LEVEL)                                                         \
  KEYWORD void LEVEL::fused_forward_blocks<float, float, float, LEVEL::ElementProducts<float>>(                      \
      const detail::AttentionParams<float, float>&, const detail::ForwardOutputs<float, float>&,                     \
      detail::FusedForwardScratch<float>&, const LEVEL::ElementProducts<float>&);                                    \
  KEYWORD void LEVEL::fused_backward_blocks<float>(const detail::AttentionParams<float>&,                            \
                                                   const detail::BackwardTensors<float>&,                            \
                                                   detail::FusedBackwardScratch<float>&);                            \
  SELFATTN_DETAIL_LEVEL_DECODE(KEYWORD, LEVEL, float);                                                               \
  SELFATTN_DETAIL_LEVEL_DECODE(KEYWORD, LEVEL, bfloat16);                                                            \
  SELFATTN_DETAIL_LEVEL_DECODE(KEYWORD, LEVEL, float16);                                                             \
  SELFATTN_DETAIL_LEVEL_DECODE(KEYWORD, LEVEL, std::int8_t);                                                         \
  KEYWORD void LEVEL::linear_few_rows<float, float>(                                                                 \
      const std::array<const float*, detail::few_rows_max>&, const std::array<float*, detail::few_rows_max>&, Index, \
      Index, const TensorView<const float, 2>&, const TensorView<const float, 1>&)
/// \endcond
