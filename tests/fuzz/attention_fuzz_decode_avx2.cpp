// tests/fuzz/attention_fuzz_decode_avx2.cpp — the float decode kernel's paths at the avx2 level, for the
// libFuzzer attention target (attention_kernels.hpp says why they have a file of their own).
#include "attention_kernels.hpp"

#if SELFATTN_DISPATCH_X86
SELFATTN_FUZZ_DECODE_LEVEL_INSTANCE(template, detail::isa_avx2)
#endif
