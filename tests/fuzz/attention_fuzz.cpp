// tests/fuzz/attention_fuzz.cpp — libFuzzer target for the attention API: the first byte picks float or double,
// the rest one call (attention_case.hpp says what is checked).
//
// Built two ways (tests/fuzz/CMakeLists.txt): with clang's -fsanitize=fuzzer as the fuzzer, and with
// replay_main.cpp as an ordinary program that runs every file of the committed corpus (a ctest test).
#include "attention_case.hpp"

#include <cstddef>
#include <cstdint>

// Compiled in attention_fuzz_double.cpp.
extern template void selfattn::fuzz::attention::run_case<double>(selfattn::fuzz::FuzzInput& in);

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  selfattn::fuzz::FuzzInput in(data, size);
  if (in.flag())
    selfattn::fuzz::attention::run_case<float>(in);
  else
    selfattn::fuzz::attention::run_case<double>(in);
  return 0;
}
