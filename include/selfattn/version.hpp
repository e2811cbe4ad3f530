/// \file
/// The library's version as preprocessor macros, for `#if` checks and for printing.
///
/// The three numbers below are the one place the version is written: CMakeLists.txt reads them from this file
/// for `project(selfattn VERSION ...)`, so the CMake package, the pkg-config file and these macros cannot
/// disagree.
/// \code
/// #include <selfattn/version.hpp>
/// #if SELFATTN_VERSION < 200   // older than 0.2.0
/// #error "needs selfattn 0.2 or newer"
/// #endif
/// std::printf("selfattn %s\n", SELFATTN_VERSION_STRING);   // "0.1.0"
/// \endcode
#pragma once

/// Major version: incompatible changes (while it is 0, a new minor version may break the API).
#define SELFATTN_VERSION_MAJOR 0
/// Minor version.
#define SELFATTN_VERSION_MINOR 1
/// Patch version.
#define SELFATTN_VERSION_PATCH 0

/// The version as one integer, major * 10000 + minor * 100 + patch: 0.1.0 is 100, 1.2.3 is 10203.
#define SELFATTN_VERSION (SELFATTN_VERSION_MAJOR * 10000 + SELFATTN_VERSION_MINOR * 100 + SELFATTN_VERSION_PATCH)

/// \cond SELFATTN_INTERNAL
#define SELFATTN_DETAIL_STRINGIFY_(x) #x
#define SELFATTN_DETAIL_STRINGIFY(x) SELFATTN_DETAIL_STRINGIFY_(x)
/// \endcond

/// The version as a string literal, "major.minor.patch" (e.g. "0.1.0"), made from the three numbers above.
#define SELFATTN_VERSION_STRING                                                                        \
  SELFATTN_DETAIL_STRINGIFY(SELFATTN_VERSION_MAJOR)                                                    \
  "." SELFATTN_DETAIL_STRINGIFY(SELFATTN_VERSION_MINOR) "." SELFATTN_DETAIL_STRINGIFY(SELFATTN_VERSION_PATCH)
