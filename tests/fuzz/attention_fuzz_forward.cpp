// tests/fuzz/attention_fuzz_forward.cpp — the float forward of the libFuzzer attention target: validation, dispatch
// and the reference kernel; the fused and decode kernels are in files of their own (attention_kernels.hpp says why).
#include "attention_kernels.hpp"

SELFATTN_FUZZ_FUSED_INSTANCE(extern template);
SELFATTN_FUZZ_DECODE_INSTANCE(extern template);
SELFATTN_FUZZ_FORWARD_INSTANCE(template);
