// Helpers shared by unit tests (never by the library): a fixture with a fresh temporary
// directory per test and a way to write files into it.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "echelon/common/fs.h"

namespace echelon {

class TempDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const ::testing::TestInfo* t = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = std::filesystem::temp_directory_path() /
           (std::string(t->test_suite_name()) + "." + t->name() + "." + std::to_string(::getpid()));
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // Writes `text` to dir_/name; returns the path.
  std::string Write(const std::string& name, const std::string& text) {
    const std::string path = (dir_ / name).string();
    EXPECT_TRUE(WriteFileAtomic(path, text).ok()) << path;
    return path;
  }

  std::filesystem::path dir_;
};

}  // namespace echelon
