#include "compass-runner/state_roots.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>

#include "compass-runner/backend.h"

namespace runner {
namespace {

namespace fs = std::filesystem;

class StateRootsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("runner-roots-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_ / "a");
    fs::create_directories(dir_ / "b");
    registry_ = (dir_ / "registry").string();
  }
  void TearDown() override { fs::remove_all(dir_); }

  fs::path dir_;
  std::string registry_;
};

TEST_F(StateRootsTest, RegisteredRootsAreKnownOnceEachBesideTheOwnOne) {
  const std::string a = (dir_ / "a").string();
  const std::string b = (dir_ / "b").string();
  registerStateRoot(a, registry_);
  registerStateRoot(b, registry_);
  registerStateRoot(b, registry_);  // again: nothing more
  EXPECT_EQ(std::distance(fs::directory_iterator(registry_), fs::directory_iterator()), 2);
  struct stat st {};
  ASSERT_EQ(::stat(registry_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  auto roots = knownStateRoots(a, registry_);
  std::sort(roots.begin(), roots.end());
  EXPECT_EQ(roots, (std::vector<std::string>{a, b}));
}

TEST_F(StateRootsTest, ARootThatIsGoneIsForgotten) {
  const std::string a = (dir_ / "a").string();
  const std::string b = (dir_ / "b").string();
  registerStateRoot(b, registry_);
  fs::remove(b);
  EXPECT_EQ(knownStateRoots(a, registry_), std::vector<std::string>{a});
  EXPECT_TRUE(fs::is_empty(registry_));
}

TEST_F(StateRootsTest, ARegistryOthersMayWriteIsRefused) {
  fs::create_directories(registry_);
  ::chmod(registry_.c_str(), 0777);
  EXPECT_THROW(registerStateRoot((dir_ / "a").string(), registry_), RunnerError);
}

TEST_F(StateRootsTest, NoRegistryGivesTheOwnRootAlone) {
  EXPECT_EQ(knownStateRoots("/own", (dir_ / "missing").string()), std::vector<std::string>{"/own"});
}

}  // namespace
}  // namespace runner
