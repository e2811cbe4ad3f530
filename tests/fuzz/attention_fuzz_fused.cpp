// tests/fuzz/attention_fuzz_fused.cpp — the float fused forward kernel of the libFuzzer attention target
// (attention_kernels.hpp says why it has a file of its own).
#include "attention_kernels.hpp"

SELFATTN_FUZZ_FUSED_INSTANCE(template);
