// A test's own scratch folder, for fixtures that write files.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <utility>

namespace pinstage::test {

// dir_ is <tmp>/pinstage_<tag>_<pid>_<test name>, made before each test and removed after
// it, so tests running at once (ctest -j) never share files.
class TempDirTest : public ::testing::Test {
 protected:
  explicit TempDirTest(std::string tag) : tag_(std::move(tag)) {}
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("pinstage_" + tag_ + "_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  std::filesystem::path dir_;

 private:
  std::string tag_;
};

}  // namespace pinstage::test
