// tests/fuzz/attention_fuzz_decode.cpp — the float decode kernel of the libFuzzer attention target
// (attention_kernels.hpp says why it has a file of its own), its paths at the generic level; the dispatched levels'
// are attention_fuzz_decode_avx512.cpp and _avx2.cpp.
#include "attention_kernels.hpp"

#if SELFATTN_DISPATCH_X86
SELFATTN_FUZZ_DECODE_LEVEL_INSTANCE(extern template, detail::isa_avx512)
SELFATTN_FUZZ_DECODE_LEVEL_INSTANCE(extern template, detail::isa_avx2)
#endif
SELFATTN_FUZZ_DECODE_INSTANCE(template);
