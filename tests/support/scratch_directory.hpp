// tests/support/scratch_directory.hpp — a test fixture with a fresh directory of its own: created before each test
// (under the system's temporary directory, named after the test), removed with everything in it after.
// Used by the picture tests (heatmap_test.cpp, line_chart_test.cpp), which write files and read them back.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <system_error>

namespace selfattn::test {

class ScratchDirectoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    dir_ = std::filesystem::temp_directory_path() /
           ("selfattn_" + name + "_" + std::to_string(std::random_device{}()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }
  /// `file` inside the scratch directory.
  std::string path(const std::string& file) const { return (dir_ / file).string(); }
  /// The bytes of a file ("" when it cannot be read).
  static std::string read(const std::string& file) {
    std::ifstream in(file, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  std::filesystem::path dir_;
};

}  // namespace selfattn::test
