// tests/fuzz/attention_fuzz.cpp — libFuzzer target for the attention API: the first byte picks float or double,
// the rest one call (attention_case.hpp says what is checked).
//
// Built two ways (tests/fuzz/CMakeLists.txt): with clang's -fsanitize=fuzzer as the fuzzer, and with
// replay_main.cpp as an ordinary program that runs every file of the committed corpus (a ctest test).
#include "attention_case.hpp"
#include "attention_kernels.hpp"

#include <cstddef>
#include <cstdint>

// Compiled in attention_fuzz_double.cpp.
extern template void selfattn::fuzz::attention::run_case<double>(selfattn::fuzz::FuzzInput& in);
// Compiled in attention_fuzz_{forward,fused,decode,backward}.cpp (the libFuzzer build), or taken from the tests'
// shared instances (the replay).
SELFATTN_FUZZ_FORWARD_INSTANCE(extern template);
SELFATTN_FUZZ_FUSED_INSTANCE(extern template);
SELFATTN_FUZZ_DECODE_INSTANCE(extern template);
SELFATTN_FUZZ_BACKWARD_INSTANCE(extern template);

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  selfattn::fuzz::FuzzInput in(data, size);
  if (in.flag())
    selfattn::fuzz::attention::run_case<float>(in);
  else
    selfattn::fuzz::attention::run_case<double>(in);
  return 0;
}
