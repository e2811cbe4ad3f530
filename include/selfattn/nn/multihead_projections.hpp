/// \file
/// The input projections of MultiHeadAttention: self-attention's Q|K|V in one GEMM, cross-attention's three, and a
/// memory's keys and values projected once for many decode steps. Each result is split into heads (B, heads, L, Dh).
#pragma once

#include <selfattn/heads.hpp>
#include <selfattn/nn/module_workspace.hpp>
#include <selfattn/nn/multihead_types.hpp>
#include <selfattn/nn/widened_activations.hpp>
#include <selfattn/projection.hpp>
#include <selfattn/tensor.hpp>

#include <array>
#include <utility>

namespace selfattn::detail {

/// Self-attention: query, key and value are one tensor, projected with one GEMM.
template <typename T>
bool is_self_attention(const TensorView<const T, 3>& query, const TensorView<const T, 3>& key,
                       const TensorView<const T, 3>& value) {
  return same_view(query, key) && same_view(key, value);
}

/// Width of the Q|K|V projection of self-attention: E + 2 Hkv Dh.
inline Index qkv_projection_width(const MultiHeadAttentionConfig& config) {
  return config.embed_dim + 2 * config.num_kv_heads * (config.embed_dim / config.num_heads);
}

/// The self-attention projection of x into qkv (B, L, E + 2 Hkv Dh), one GEMM (or three for a few rows), returned as
/// its column blocks q, k, v. Parameters stored as P: T, or 16 bits (widened into `stacked`).
template <typename T, typename P>
std::array<TensorView<T, 3>, 3> project_self_into(const MultiHeadAttentionConfig& config,
                                                  const MhaParams<P>& parameters, const TensorView<const T, 3>& x,
                                                  const TensorView<T, 3>& qkv, StackedProjection<T>& stacked) {
  fused_qkv_projection_into<T, P>(
      x, {parameters.q_weight.view(), parameters.k_weight.view(), parameters.v_weight.view()},
      {parameters.q_bias.view(), parameters.k_bias.view(), parameters.v_bias.view()}, qkv, stacked);
  const Index e = config.embed_dim, kv = config.num_kv_heads * (e / config.num_heads);
  const auto block = [&](Index column, Index width) {
    // An empty projection (B = 0 or L = 0) has no data to offset.
    return TensorView<T, 3>(qkv.empty() ? nullptr : qkv.data() + column, {qkv.dim(0), qkv.dim(1), width},
                            qkv.strides());
  };
  return {block(0, e), block(e, kv), block(e + kv, kv)};
}

/// forward_into's projections of query, key and value into ws.projection: one GEMM for self-attention (the column
/// blocks of one (B, L, E + 2 Hkv Dh) buffer), else three into three contiguous blocks of it. Parameters stored as P.
template <typename T, typename P>
std::array<TensorView<T, 3>, 3> project_into(const MultiHeadAttentionConfig& config, const MhaParams<P>& parameters,
                                             const TensorView<const T, 3>& query, const TensorView<const T, 3>& key,
                                             const TensorView<const T, 3>& value, MhaWorkspace<T>& ws) {
  const Index batch = query.dim(0), q_len = query.dim(1), k_len = key.dim(1), e = config.embed_dim;
  if (is_self_attention(query, key, value)) {
    const std::array<Index, 3> shape{batch, q_len, qkv_projection_width(config)};
    return project_self_into(config, parameters, query, MhaWorkspace<T>::take(ws.projection, shape), ws.stacked);
  }
  const Index kv = config.num_kv_heads * (e / config.num_heads);
  T* base = MhaWorkspace<T>::take(ws.projection, std::array<Index, 1>{batch * (q_len * e + 2 * k_len * kv)}).data();
  const std::array<TensorView<T, 3>, 3> projections{
      TensorView<T, 3>(base, {batch, q_len, e}), TensorView<T, 3>(base + batch * q_len * e, {batch, k_len, kv}),
      TensorView<T, 3>(base + batch * (q_len * e + k_len * kv), {batch, k_len, kv})};
  linear_into_stored<T, P>(query, parameters.q_weight.view(), parameters.q_bias.view(), projections[0], ws.stacked);
  linear_into_stored<T, P>(key, parameters.k_weight.view(), parameters.k_bias.view(), projections[1], ws.key_weights);
  linear_into_stored<T, P>(value, parameters.v_weight.view(), parameters.v_bias.view(), projections[2],
                           ws.value_weights);
  return projections;
}

/// x W^T + b for one of the projections, through the kernel of forward_into's cross-attention path (a few rows as
/// many: the same bits).
template <typename T>
Tensor<T, 3> project_rows(const TensorView<const T, 3>& x, const Tensor<T, 2>& weight, const Tensor<T, 1>& bias) {
  Tensor<T, 3> y(std::array<Index, 3>{x.dim(0), x.dim(1), weight.dim(0)});
  StackedProjection<T> unused;  // T weights: nothing to widen
  linear_into_stored<T, T>(x, weight.view(), bias.view(), y.view(), unused);
  return y;
}

/// The heads of a projection, copied out contiguous: (B, L, count Dh) -> (B, count, L, Dh).
template <typename T>
Tensor<T, 4> contiguous_heads(const TensorView<T, 3>& x, Index count) {
  return Tensor<T, 4>(split_heads(x, count));
}

/// The keys and values of a cross-attention's memory, projected and split into heads: (B, Hkv, Lk, Dh) each.
template <typename T>
MemoryKeysValues<T> project_memory(const MultiHeadAttentionConfig& config, const MhaParams<T>& parameters,
                                   const TensorView<const T, 3>& key, const TensorView<const T, 3>& value) {
  return {contiguous_heads(project_rows(key, parameters.k_weight, parameters.k_bias).view(), config.num_kv_heads),
          contiguous_heads(project_rows(value, parameters.v_weight, parameters.v_bias).view(), config.num_kv_heads)};
}

/// The projections of query, key and value split into heads, each head copied out contiguous: one GEMM for Q|K|V
/// when they are the same tensor, else three, then one copy per tensor. Read in place, a head's rows would sit
/// E + 2 Hkv Dh values apart, and the attention kernels run 20 to 25 % slower on them (measured at L = 2048,
/// E = 512, H = 8); the copy costs a few percent of the projection's GEMM.
template <typename T>
ProjectedHeads<T> project_heads(const MultiHeadAttentionConfig& config, const MhaParams<T>& parameters,
                                const TensorView<const T, 3>& query, const TensorView<const T, 3>& key,
                                const TensorView<const T, 3>& value) {
  if (is_self_attention(query, key, value)) {
    Tensor<T, 3> qkv(std::array<Index, 3>{query.dim(0), query.dim(1), qkv_projection_width(config)});
    StackedProjection<T> stacked;
    const std::array<TensorView<T, 3>, 3> blocks = project_self_into(config, parameters, query, qkv.view(), stacked);
    return {contiguous_heads(blocks[0], config.num_heads), contiguous_heads(blocks[1], config.num_kv_heads),
            contiguous_heads(blocks[2], config.num_kv_heads)};
  }
  MemoryKeysValues<T> memory = project_memory(config, parameters, key, value);
  return {contiguous_heads(project_rows(query, parameters.q_weight, parameters.q_bias).view(), config.num_heads),
          std::move(memory.keys), std::move(memory.values)};
}

}  // namespace selfattn::detail
