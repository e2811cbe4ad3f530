// A user's program against the installed package. Exit code 0 iff the library behaves, the version macros agree
// with the package's version, and OpenMP came through the documented link.
#include <selfattn/selfattn.hpp>

#include "version_snippet.hpp"  // docs/using_in_projects.md: a version check at compile time

#include <cstdio>
#include <cstring>

#ifndef _OPENMP
#error "OpenMP::OpenMP_CXX, linked as docs/using_in_projects.md shows, did not enable OpenMP"
#endif

static_assert(SELFATTN_VERSION ==
                  SELFATTN_VERSION_MAJOR * 10000 + SELFATTN_VERSION_MINOR * 100 + SELFATTN_VERSION_PATCH,
              "SELFATTN_VERSION is major * 10000 + minor * 100 + patch");

int main() {
  selfattn::Tensor<double, 2> t({2, 3});
  t(1, 2) = 4.0;
  const bool tensor_ok = t.size() == 6 && t(1, 2) == 4.0 && t.dim(1) == 3;
  // SELFATTN_EXPECTED_VERSION: selfattn_VERSION of the package that find_package found.
  const bool version_ok = std::strcmp(SELFATTN_VERSION_STRING, SELFATTN_EXPECTED_VERSION) == 0;
  std::printf("selfattn %s (package %s), SELFATTN_VERSION %d: %s\n", SELFATTN_VERSION_STRING,
              SELFATTN_EXPECTED_VERSION, SELFATTN_VERSION, tensor_ok && version_ok ? "ok" : "WRONG");
  return tensor_ok && version_ok ? 0 : 1;
}
