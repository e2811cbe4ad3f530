/// \file
/// Compile the attention kernels once per program instead of once per translation unit: `extern template`
/// declarations, for float and double (and the float kernels on bfloat16 / float16 storage), of the templates
/// that do the work behind the public functions.
///
/// The public functions (`sdpa_forward`, `sdpa_forward_into`, `sdpa_backward`, `scaled_dot_product_attention`,
/// `attention_weights`, `linear`, `linear_backward`) are thin templates over their argument types; each forwards
/// to one function template of the element type alone, which holds the validation and the kernels. Those, the
/// layers' norm, activation and feed-forward functions, and `MultiHeadAttention`, `FeedForward`, `LayerNorm` /
/// `RMSNorm` (their base), `TransformerLayer` and `TransformerStack` of `<float>` / `<double>`, are declared here
/// as instantiated elsewhere, so a translation unit that includes this header compiles none of the kernels. So are
/// the kernels behind 16-bit storage: the forward on bfloat16 / float16 q, k, v, the forward and decode on 16-bit keys
/// and values (a 16-bit KV cache) and the projections by 16-bit weights; and the forward and decode on int8 keys and
/// values (an int8 KV cache, a paged one included).
/// Exactly one .cpp file of the program includes <selfattn/instantiate.hpp>, which defines them:
/// \code
/// // attention.cpp, the one translation unit that compiles the kernels:
/// #include <selfattn/instantiate.hpp>
///
/// // every other file:
/// #include <selfattn/selfattn.hpp>
/// #include <selfattn/extern_templates.hpp>
/// auto fwd = selfattn::sdpa_forward(q, k, v, opts);   // calls the instance compiled in attention.cpp
/// \endcode
/// Build the instantiating file with the flags of the rest of the program (optimisation, -march, OpenMP):
/// the kernels run as that file was compiled. Without it the program does not link (undefined
/// `selfattn::detail::sdpa_forward_views<float>` and the like). Other element types, and member templates such
/// as `MultiHeadAttention::forward`, are still compiled where they are used (the latter are thin too: they call
/// the module's instantiated members). Not included by <selfattn/selfattn.hpp>: it is a choice of the program. The
/// list of instances, by signature, is internal (detail/instantiation_list.hpp).
#pragma once

#include <selfattn/attention.hpp>
#include <selfattn/detail/instantiation_list.hpp>
#include <selfattn/nn/activation.hpp>
#include <selfattn/nn/feed_forward.hpp>
#include <selfattn/nn/multihead.hpp>
#include <selfattn/nn/norm.hpp>
#include <selfattn/nn/transformer_layer.hpp>
#include <selfattn/nn/transformer_stack.hpp>
#include <selfattn/projection.hpp>

/// \cond SELFATTN_INTERNAL
namespace selfattn {
SELFATTN_DETAIL_EXPLICIT_INSTANTIATIONS(extern template, float);
SELFATTN_DETAIL_EXPLICIT_INSTANTIATIONS(extern template, double);
SELFATTN_DETAIL_SIXTEEN_BIT_INSTANTIATIONS(extern template, bfloat16);
SELFATTN_DETAIL_SIXTEEN_BIT_INSTANTIATIONS(extern template, float16);
SELFATTN_DETAIL_STORED_KV_INSTANTIATIONS(extern template, std::int8_t);
SELFATTN_DETAIL_LEVEL_INSTANTIATIONS(extern template, detail);
#if SELFATTN_DISPATCH_X86
SELFATTN_DETAIL_LEVEL_INSTANTIATIONS(extern template, detail::isa_avx2);
SELFATTN_DETAIL_LEVEL_INSTANTIATIONS(extern template, detail::isa_avx512);
#endif
}  // namespace selfattn
/// \endcond
