// tests/support/expect_error.hpp — assert that a call throws a given exception type whose message
// contains every expected fragment (argument name, expected and actual shape, ...).
#pragma once

#include <gtest/gtest.h>

#include <exception>
#include <string>
#include <vector>

namespace selfattn::test {

template <typename E, typename F>
void expect_error(F&& call, const std::vector<std::string>& fragments) {
  try {
    call();
    ADD_FAILURE() << "no exception";
  } catch (const E& error) {
    const std::string message = error.what();
    for (const auto& fragment : fragments)
      EXPECT_NE(message.find(fragment), std::string::npos) << "'" << fragment << "' not in: " << message;
  } catch (const std::exception& other) {
    ADD_FAILURE() << "wrong exception type: " << other.what();
  }
}

}  // namespace selfattn::test
