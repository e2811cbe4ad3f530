// tests/fuzz/attention_fuzz_decode.cpp — the float decode kernel of the libFuzzer attention target
// (attention_kernels.hpp says why it has a file of its own).
#include "attention_kernels.hpp"

SELFATTN_FUZZ_DECODE_INSTANCE(template);
