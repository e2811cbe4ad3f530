// tests/support/scalars.hpp — the element types every typed test runs in, and the empty fixture they share:
//
//   template <typename T>
//   using KVCacheTest = test::ScalarTest<T>;
//   TYPED_TEST_SUITE(KVCacheTest, test::Scalars, );
//
// Each file names its suite through the alias, so ctest's test names (KVCacheTest/0.Name) stay the file's own.
#pragma once

#include <gtest/gtest.h>

namespace selfattn::test {

/// float and double, each held to its own tolerance (default_tolerance, compare.hpp). One list for every file, so
/// that the precisions the tests cover are decided in one place. (16-bit storage: half_precision_test.cpp.)
using Scalars = ::testing::Types<float, double>;

/// The fixture of a typed suite that needs no state of its own (most of them).
template <typename T>
class ScalarTest : public ::testing::Test {};

}  // namespace selfattn::test
