// example_args.hpp — the option most examples share: --seed N, the seed of every random number an example draws.
// Not part of the library; a few lines, so that every example reads (and rejects) a seed the same way:
//
//   std::uint64_t seed = 1;
//   if (!seed_argument(argc, argv, seed)) return 2;  // the only option: [--seed N]
#pragma once

#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

/// Reads `text` as a seed: decimal digits only, at most 2^64 - 1. strtoull alone would also take "", " 7", "-1"
/// (as 2^64 - 1) and a number too large (as 2^64 - 1): a seed other than the one asked for, without a word.
inline bool parse_seed(const char* text, std::uint64_t& seed) {
  if (!std::isdigit(static_cast<unsigned char>(text[0]))) return false;
  char* end = nullptr;
  errno = 0;
  const unsigned long long value = std::strtoull(text, &end, 10);
  if (*end != '\0' || errno == ERANGE) return false;
  seed = value;
  return true;
}

/// The command line of an example whose only option is --seed N: sets `seed` from it (left as it is without it).
/// Anything else (another argument, no N, an N that is not a seed) prints what was wrong and returns false.
inline bool seed_argument(int argc, char** argv, std::uint64_t& seed) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--seed") != 0 || i + 1 == argc) {
      std::fprintf(stderr, "usage: %s [--seed N]\n", argv[0]);
      return false;
    }
    if (!parse_seed(argv[++i], seed)) {
      std::fprintf(stderr, "%s: --seed %s: N must be a whole number from 0 to 2^64 - 1\n", argv[0], argv[i]);
      return false;
    }
  }
  return true;
}
