// tests/fuzz/attention_kernels.hpp — the float kernels behind the attention fuzz target's calls, as explicit
// instantiations: `extern template` in attention_fuzz.cpp, each defined in a file of its own (attention_fuzz_*.cpp:
// forward (the validation and the reference kernel), fused, decode, backward). Under the libFuzzer flags (-O1,
// coverage, ASan, UBSan) the float half compiled in one file took about 200 s of one core while the other had run out
// of work; the forward alone, its fused and decode kernels included, still took most of it. In four files it builds
// on both cores. The decode kernel's paths at the two dispatched levels have files of their own too
// (attention_fuzz_decode_avx512.cpp, _avx2.cpp): with them the decode file took 145 s of one core, the stage's
// longest compile (CI, 2026-12-07). The corpus-replay program (tests/fuzz/CMakeLists.txt) takes the tests' shared
// instances instead.
#pragma once

#include <selfattn/attention.hpp>
#include <selfattn/detail/instantiation_list.hpp>

#define SELFATTN_FUZZ_FORWARD_INSTANCE(KEYWORD)                                                                 \
  KEYWORD selfattn::AttentionForward<float> selfattn::detail::sdpa_forward_views<float>(                         \
      const char*, const selfattn::TensorView<const float, 4>&, const selfattn::TensorView<const float, 4>&,      \
      const selfattn::TensorView<const float, 4>&, const selfattn::AttentionOptions<float>&)

#define SELFATTN_FUZZ_BACKWARD_INSTANCE(KEYWORD)                                                                \
  KEYWORD selfattn::AttentionGradients<float> selfattn::detail::sdpa_backward_views<float>(                      \
      const char*, const selfattn::TensorView<const float, 4>&, const selfattn::TensorView<const float, 4>&,      \
      const selfattn::TensorView<const float, 4>&, const selfattn::TensorView<const float, 4>&,                   \
      const selfattn::TensorView<const float, 3>&, const selfattn::TensorView<const float, 4>&,                   \
      const selfattn::AttentionOptions<float>&)

#define SELFATTN_FUZZ_FUSED_INSTANCE(KEYWORD)                                                                   \
  KEYWORD void selfattn::detail::fused_forward<float>(const selfattn::detail::AttentionParams<float>&,           \
                                                      const selfattn::detail::ForwardOutputs<float>&,           \
                                                      selfattn::detail::FusedForwardScratch<float>&)

#define SELFATTN_FUZZ_DECODE_INSTANCE(KEYWORD)                                                                  \
  KEYWORD void selfattn::detail::decode_forward<float>(const selfattn::detail::AttentionParams<float>&,          \
                                                       const selfattn::detail::ForwardOutputs<float>&,          \
                                                       selfattn::detail::DecodeScratch<float>&)

// The decode kernel's three paths at one dispatched level (LEVEL: detail::isa_avx512 or detail::isa_avx2).
#define SELFATTN_FUZZ_DECODE_LEVEL_INSTANCE(KEYWORD, LEVEL) \
  namespace selfattn {                                      \
  SELFATTN_DETAIL_LEVEL_DECODE(KEYWORD, LEVEL, float);      \
  }
