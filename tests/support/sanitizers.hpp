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

}  // namespace selfattn::test
