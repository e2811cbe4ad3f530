// Tests of errors.hpp: the message format every public entry relies on.
#include <selfattn/errors.hpp>

#include "support/expect_error.hpp"

#include <gtest/gtest.h>

#include <array>
#include <stdexcept>
#include <type_traits>

namespace selfattn::test {
namespace {

TEST(ErrorsTest, ShapeErrorIsAnInvalidArgument) {
  static_assert(std::is_base_of_v<std::invalid_argument, ShapeError>);
  EXPECT_THROW(throw ShapeError("x"), std::invalid_argument);
}

TEST(ErrorsTest, CheckShapeNamesFunctionArgumentExpectedAndActual) {
  const std::array<Index, 4> actual{2, 4, 10, 64};
  EXPECT_NO_THROW(detail::check_shape<4>("f", "k", actual, {2, detail::any_extent, 10, 64}));
  expect_error<ShapeError>([&] { detail::check_shape<4>("sdpa_forward", "k", actual, {2, 8, detail::any_extent, 64}); },
                           {"[sdpa_forward] k: expected shape (2, 8, *, 64), got (2, 4, 10, 64)"});
}

TEST(ErrorsTest, CheckBroadcastableAcceptsOnesAndEqualExtents) {
  const std::array<Index, 4> target{2, 4, 5, 6};
  EXPECT_NO_THROW(detail::check_broadcastable<4>("f", "m", {1, 4, 1, 6}, target));
  EXPECT_NO_THROW(detail::check_broadcastable<4>("f", "m", {2, 4, 5, 6}, target));
  expect_error<ShapeError>([&] { detail::check_broadcastable<4>("f", "opts.bias", {1, 4, 5, 5}, target); },
                           {"[f] opts.bias:", "broadcastable to (2, 4, 5, 6)", "got (1, 4, 5, 5)"});
}

TEST(ErrorsTest, InvalidArgumentHelperIsNotAShapeError) {
  try {
    detail::throw_invalid("g", "opts.scale", "expected a finite value");
  } catch (const ShapeError&) {
    ADD_FAILURE() << "option errors are plain invalid_argument";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "[g] opts.scale: expected a finite value");
  }
}

}  // namespace
}  // namespace selfattn::test
