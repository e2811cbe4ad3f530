// tests/support/level_copy.hpp — for the test programs ctest runs once more per dispatch level (tests/CMakeLists.txt:
// the copies isa_<level>.*, with SELFATTN_ISA=<level> and SELFATTN_TEST_LEVEL_COPY=1): a copy whose level is the best
// this CPU has runs exactly what the unprefixed run ran (SELFATTN_ISA unset selects the best level), so it skips
// itself, and ctest reports it skipped (SKIP_REGULAR_EXPRESSION). On an AVX2 machine the avx2 copies were such
// repeats: 77 of the sanitize stage's 930 test CPU seconds (AMD EPYC Zen 3, 2026-12-07).
#pragma once

#include <selfattn/cpu.hpp>

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

namespace selfattn::test {

class SkipRepeatedLevel : public ::testing::Environment {
 public:
  void SetUp() override {
    const char* copy = std::getenv("SELFATTN_TEST_LEVEL_COPY");
    const char* level = std::getenv("SELFATTN_ISA");
    if (copy == nullptr || level == nullptr) return;
    // The detection without the override, not cpu_info(): that throws for a level above this CPU's, and those
    // copies must reach their tests, whose error ctest reports as skipped ("levels up to").
    const std::string best = to_string(detail::best_level(detail::detect_cpu()));
    if (best == level) GTEST_SKIP() << "SELFATTN_ISA=" << level << " repeats the unprefixed run on this CPU";
  }
};

// One registration per test program: each of these programs is one file, which includes this header once.
inline ::testing::Environment* const skip_repeated_level = ::testing::AddGlobalTestEnvironment(new SkipRepeatedLevel);

}  // namespace selfattn::test
