// tests/support/sanitizers.hpp — whether this test program runs under AddressSanitizer or ThreadSanitizer, and the
// size of a random sweep there.
//
// The sanitizers look for memory and thread errors, which every code path shows on its first cases; the numbers of
// every case are checked in full by the optimised build. So under a sanitizer (where each case runs 10 to 50 times
// slower) the long random sweeps and streams draw a quarter of their cases:
//
//   while (configs < test::sweep_cases(400)) { ... }
#pragma once

#include <algorithm>
#include <cstddef>

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SELFATTN_TEST_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define SELFATTN_TEST_SANITIZED 1
#endif
#endif

namespace selfattn::test {

#ifdef SELFATTN_TEST_SANITIZED
constexpr bool sanitized = true;
#else
constexpr bool sanitized = false;
#endif

/// `cases` in an ordinary build, a quarter of them (at least one) under a sanitizer.
constexpr long sweep_cases(long cases) { return sanitized ? std::max(1L, cases / 4) : cases; }

/// Whether case `index` of a sweep runs: every one in an ordinary build, every third under a sanitizer. Numbered by a
/// running count over nested loops whose inner loop has a length prime to 3, the cases kept take each inner value
/// with each outer one in turn.
constexpr bool sweep_case_runs(std::size_t index) { return !sanitized || index % 3 == 0; }

/// Whether case (shape, kind) of a sweep over shapes x mask kinds runs: every one in an ordinary build; under a
/// sanitizer a third of them, chosen so that each shape meets a third of the kinds and each kind a third of the shapes
/// (the memory errors a sanitizer looks for show on any case of a path; each path is a kind on some shape).
constexpr bool sweep_pair_runs(std::size_t shape, std::size_t kind) { return sweep_case_runs(shape + kind); }

/// How many of `shapes` x `kinds` pairs sweep_pair_runs keeps: all of them in an ordinary build.
constexpr int sweep_pairs_run(std::size_t shapes, std::size_t kinds) {
  int count = 0;
  for (std::size_t s = 0; s < shapes; ++s)
    for (std::size_t k = 0; k < kinds; ++k) count += sweep_pair_runs(s, k) ? 1 : 0;
  return count;
}

}  // namespace selfattn::test
