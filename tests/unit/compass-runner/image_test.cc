// image.h isDirectoryIn() over a real directory tree standing for an image's root: a --workdir
// is looked up as the container would see it, never through a link onto the host's files.
#include "compass-runner/image.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "compass-runner/backend.h"

namespace runner::image {
namespace {

namespace fs = std::filesystem;

class IsDirectoryInTest : public ::testing::Test {
 protected:
  void SetUp() override {
    base_ = fs::temp_directory_path() / ("image-dir-" + std::to_string(::getpid()));
    root_ = base_ / "root";
    fs::create_directories(root_ / "work" / "sub");
    fs::create_directories(base_ / "outside-only");
    std::ofstream(root_ / "file") << "x";
  }
  void TearDown() override { fs::remove_all(base_); }

  fs::path base_;
  fs::path root_;
};

TEST_F(IsDirectoryInTest, DirectoriesOfTheRootAreFound) {
  EXPECT_TRUE(isDirectoryIn(root_, "/"));
  EXPECT_TRUE(isDirectoryIn(root_, "/work"));
  EXPECT_TRUE(isDirectoryIn(root_, "/work/sub/"));
  EXPECT_TRUE(isDirectoryIn(root_, "/work/./sub/.."));
}

TEST_F(IsDirectoryInTest, MissingOrNotADirectoryIsFalse) {
  EXPECT_FALSE(isDirectoryIn(root_, "/nonexistent"));
  EXPECT_FALSE(isDirectoryIn(root_, "/file"));
  EXPECT_FALSE(isDirectoryIn(root_, "/file/below"));
}

// The host has /tmp and base_/outside-only; the root has neither. Absolute links, `..` past
// the top and relative links climbing out all resolve inside the root, as in the container.
TEST_F(IsDirectoryInTest, NothingLeadsOutOfTheRoot) {
  ASSERT_TRUE(fs::is_directory("/tmp"));
  EXPECT_FALSE(isDirectoryIn(root_, "/tmp"));
  EXPECT_FALSE(isDirectoryIn(root_, "/../outside-only"));
  fs::create_directory_symlink("/tmp", root_ / "abs-link");
  EXPECT_FALSE(isDirectoryIn(root_, "/abs-link"));
  fs::create_directory_symlink("../../outside-only", root_ / "work" / "climb");
  EXPECT_FALSE(isDirectoryIn(root_, "/work/climb"));
  fs::create_directory_symlink("/work/sub", root_ / "in-root-link");
  EXPECT_TRUE(isDirectoryIn(root_, "/in-root-link"));  // absolute, but to the root's own dir
}

TEST_F(IsDirectoryInTest, AnUnreadableRootIsAnError) {
  EXPECT_THROW(isDirectoryIn(base_ / "no-such-root", "/"), RunnerError);
  EXPECT_THROW(isDirectoryIn(root_ / "file", "/"), RunnerError);
}

}  // namespace
}  // namespace runner::image
