/// \file
/// The whole library in one include. Only includes.
///
/// \code
/// #include <selfattn/selfattn.hpp>
/// using namespace selfattn;
///
/// Tensor<float, 4> q({2, 8, 16, 64}), k({2, 2, 16, 64}), v({2, 2, 16, 64});   // (B, H, L, D), GQA: Hkv = 2
/// AttentionOptions<float> opts;
/// opts.causal = Causal::top_left;
/// Tensor<float, 4> o = scaled_dot_product_attention(q, k, v, opts);           // (B, H, L, D)
/// \endcode

/// \namespace selfattn
/// Every public name of the library; `selfattn::detail` holds internals that may change.
///
/// Dimension letters, the same in every shape block: B batch, H query heads, Hkv key/value heads,
/// Lq / Lk query / key length, D head dim of q and k, Dv head dim of v, E embed dim, Dh = E / H
/// (head dim inside the module).
#pragma once

#include <selfattn/attend_with_weights.hpp>
#include <selfattn/attention.hpp>
#include <selfattn/errors.hpp>
#include <selfattn/half_precision.hpp>
#include <selfattn/heads.hpp>
#include <selfattn/int8_attention.hpp>
#include <selfattn/io/npy.hpp>
#include <selfattn/io/state_dict.hpp>  // not io/safetensors.hpp: it needs nlohmann/json, include it yourself
#include <selfattn/io/transformer_state_dict.hpp>
#include <selfattn/merge.hpp>
#include <selfattn/nn/activation.hpp>
#include <selfattn/nn/draft_tree.hpp>
#include <selfattn/nn/embedding.hpp>
#include <selfattn/nn/feed_forward.hpp>
#include <selfattn/nn/kv_cache.hpp>
#include <selfattn/nn/multihead.hpp>
#include <selfattn/nn/norm.hpp>
#include <selfattn/nn/transformer_decoder_layer.hpp>
#include <selfattn/nn/transformer_decoder_stack.hpp>
#include <selfattn/nn/transformer_layer.hpp>
#include <selfattn/nn/transformer_stack.hpp>
#include <selfattn/options.hpp>
#include <selfattn/paged_attention.hpp>
#include <selfattn/paged_cache.hpp>
#include <selfattn/plot/heatmap.hpp>
#include <selfattn/plot/line_chart.hpp>
#include <selfattn/positional.hpp>
#include <selfattn/projection.hpp>
#include <selfattn/quantized.hpp>
#include <selfattn/tensor.hpp>
#include <selfattn/train/adamw.hpp>
#include <selfattn/train/cross_entropy.hpp>
#include <selfattn/train/parameters.hpp>
#include <selfattn/train/schedule.hpp>
#include <selfattn/version.hpp>
#include <selfattn/workspace.hpp>
