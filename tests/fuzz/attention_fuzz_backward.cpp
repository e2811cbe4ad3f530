// tests/fuzz/attention_fuzz_backward.cpp — the float backward kernels of the libFuzzer attention target
// (attention_kernels.hpp says why they have a file of their own).
#include "attention_kernels.hpp"

SELFATTN_FUZZ_BACKWARD_INSTANCE(template);
