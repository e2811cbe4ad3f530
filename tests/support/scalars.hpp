// tests/support/scalars.hpp — the element types every typed test runs in:
//
//   template <typename T>
//   class KVCacheTest : public ::testing::Test {};
//   TYPED_TEST_SUITE(KVCacheTest, test::Scalars, );
#pragma once

#include <gtest/gtest.h>

namespace selfattn::test {

/// float and double, each held to its own tolerance (default_tolerance, compare.hpp). One list for every file, so
/// that the precisions the tests cover are decided in one place. (16-bit storage: half_precision_test.cpp.)
using Scalars = ::testing::Types<float, double>;

}  // namespace selfattn::test
