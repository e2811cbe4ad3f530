// tests/support/scalars.hpp — the element types every typed test runs in, and the empty fixture they share:
//
//   SELFATTN_SCALAR_TEST_SUITE(KVCacheTest);
//   TYPED_TEST(KVCacheTest, StepsInPiecesEqualOneCausalForward) { using T = TypeParam; ... }
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

/// A typed suite `Name` over Scalars on the empty fixture: `Name` is an alias of ScalarTest, so each file's suite keeps
/// its own name in the test list (KVCacheTest/0.StepsInPiecesEqualOneCausalForward, KVCacheTest/1...).
#define SELFATTN_SCALAR_TEST_SUITE(Name)        \
  template <typename T>                         \
  using Name = ::selfattn::test::ScalarTest<T>; \
  TYPED_TEST_SUITE(Name, ::selfattn::test::Scalars, )
