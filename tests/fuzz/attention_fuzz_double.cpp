// tests/fuzz/attention_fuzz_double.cpp — run_case<double> of the attention fuzz target, compiled beside
// attention_fuzz.cpp (run_case<float> and the entry point) so that the two halves build in parallel.
#include "attention_case.hpp"

template void selfattn::fuzz::attention::run_case<double>(selfattn::fuzz::FuzzInput& in);
