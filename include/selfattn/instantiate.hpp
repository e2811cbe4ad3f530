/// \file
/// The definitions that <selfattn/extern_templates.hpp> declares: include this header in exactly one .cpp file
/// of a program that uses extern_templates.hpp elsewhere. That file then compiles the attention kernels, the
/// projections and `MultiHeadAttention<float>` / `<double>` once for the whole program.
/// \code
/// // selfattn_instances.cpp: nothing else is needed in this file
/// #include <selfattn/instantiate.hpp>
/// \endcode
/// Not included by <selfattn/selfattn.hpp>. One file only: a second one would define the same instances again,
/// which C++ forbids (no diagnostic required) and which at best costs the compile time this header saves.
#pragma once

#include <selfattn/extern_templates.hpp>

/// \cond SELFATTN_INTERNAL
namespace selfattn {
SELFATTN_DETAIL_EXPLICIT_INSTANTIATIONS(template, float);
SELFATTN_DETAIL_EXPLICIT_INSTANTIATIONS(template, double);
SELFATTN_DETAIL_SIXTEEN_BIT_INSTANTIATIONS(template, bfloat16);
SELFATTN_DETAIL_SIXTEEN_BIT_INSTANTIATIONS(template, float16);
SELFATTN_DETAIL_STORED_KV_INSTANTIATIONS(template, std::int8_t);
SELFATTN_DETAIL_LEVEL_INSTANTIATIONS(template, detail);
#if SELFATTN_DISPATCH_X86
SELFATTN_DETAIL_LEVEL_INSTANTIATIONS(template, detail::isa_avx2);
SELFATTN_DETAIL_LEVEL_INSTANTIATIONS(template, detail::isa_avx512);
#endif
}  // namespace selfattn
/// \endcond
